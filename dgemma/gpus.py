"""The GPUs the what-if plan knows (`python -m dgemma.plan`), and the released checkpoint's id and vocabulary.

Torch-free on purpose: the explorer lists them while the page is served before torch has loaded.
"""

from __future__ import annotations

from dataclasses import dataclass

from dgemma.memory.units import GiB

RELEASED_ID = "google/diffusiongemma-26B-A4B-it"
RELEASED_VOCAB = 262_144  # the lesson's "real scale" pads the small model's logits to this


@dataclass(frozen=True)
class Gpu:
    key: str  # what --gpus takes
    name: str
    memory_gb: int  # the spec sheet's figure, read as GiB

    @property
    def total_bytes(self) -> int:
        return self.memory_gb * GiB

    @property
    def label(self) -> str:
        return f"{self.name} {self.memory_gb} GB"


GPUS = (
    Gpu("t4", "T4", 16), Gpu("l4", "L4", 24), Gpu("a10g", "A10G", 24), Gpu("l40s", "L40S", 48),
    Gpu("a100-40", "A100", 40), Gpu("a100-80", "A100", 80), Gpu("h100", "H100", 80), Gpu("h200", "H200", 141),
    Gpu("rtx-pro-6000", "RTX Pro 6000", 96),
)  # fmt: skip
"""RTX Pro 6000 96 GB is the card behind Hugging Face's ZeroGPU."""
