"""The GPUs the what-if plan knows (`python -m dgemma.plan`), and the released checkpoint's id and vocabulary.

Torch-free on purpose: the explorer lists them while the page is served before torch has loaded.
"""

from __future__ import annotations

from dataclasses import dataclass

from dgemma.units import GiB

RELEASED_ID = "google/diffusiongemma-26B-A4B-it"
RELEASED_VOCAB = 262_144  # the lesson's "real scale" pads the small model's logits to this
ZEROGPU_CARD_BYTES = 101_973_950_464
"""An RTX Pro 6000 Blackwell Server Edition as ZeroGPU reports it: the `memory` of its entry in
the spaces package's zero/configs.json (spaces 0.51.3). A `large` workload is half of it."""


@dataclass(frozen=True)
class Gpu:
    key: str  # what --gpus takes
    name: str
    memory_gb: int  # the spec sheet's figure, read as GiB unless `memory_bytes` says exactly
    memory_bytes: int | None = None  # where the platform states the bytes (ZeroGPU: the spaces package)
    zerogpu_size: str | None = None  # a ZeroGPU workload: what `spaces.GPU(size=...)` asks for
    space_flavor: str | None = None  # the Spaces hardware flavor with one such GPU (`suggested_hardware`)

    @property
    def total_bytes(self) -> int:
        return self.memory_bytes if self.memory_bytes is not None else self.memory_gb * GiB

    @property
    def label(self) -> str:
        return f"{self.name} {self.memory_gb} GB"


GPUS = (
    Gpu("t4", "T4", 16), Gpu("l4", "L4", 24, space_flavor="l4x1"), Gpu("a10g", "A10G", 24, space_flavor="a10g-large"),
    Gpu("l40s", "L40S", 48, space_flavor="l40sx1"), Gpu("a100-40", "A100", 40),
    Gpu("a100-80", "A100", 80, space_flavor="a100-large"), Gpu("h100", "H100", 80), Gpu("h200", "H200", 141),
    Gpu("rtx-pro-6000", "RTX Pro 6000", 96),
    Gpu("zerogpu-large", "ZeroGPU large", 48, ZEROGPU_CARD_BYTES // 2, "large"),
    Gpu("zerogpu-xlarge", "ZeroGPU xlarge", 96, ZEROGPU_CARD_BYTES, "xlarge"),
)  # fmt: skip
"""RTX Pro 6000 96 GB is the card behind Hugging Face's ZeroGPU; its two workload sizes follow."""

ZEROGPU_SIZES = tuple(g for g in GPUS if g.zerogpu_size)
"""ZeroGPU's workloads, smallest first: `large` (the default, half an RTX Pro 6000 Blackwell, 1x
quota) and `xlarge` (the whole card, 2x quota), as Hugging Face's ZeroGPU page lists them."""
