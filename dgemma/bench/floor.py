"""The floor of a sampler step: the least any step can do on the same tensors (the LM head's
projection, one softmax, the self-conditioning product), timed in `python -m dgemma.bench sampler`'s
rounds beside the steps.

Run tile by tile (`tiles`), it is the least a step tiled so can do: on a CPU each tile's two
matrix products pack the whole `[vocab, hidden]` embedding whatever the tile's rows (the BLAS does
it once a call), which the tiled floor pays as a tiled step does (docs/benchmarks.md).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from dgemma.bench import sync
from dgemma.sampling import LMHead


class Floor:
    """The floor on decoder hidden states [n, CL, hidden] and the model's `head` (its weight the
    embedding), over `tiles` (sizes summing to n; default one tile), timed by `now`."""

    def __init__(self, head: LMHead, hidden: torch.Tensor, now: Callable[[], float], tiles: tuple[int, ...] | None = None):
        self.head, self.hidden, self.now = head, hidden, now
        self.tiles = tiles or (hidden.shape[0],)
        self.times: list[float] = []

    def run_once(self) -> None:
        device, embed = self.hidden.device, self.head.weight
        if device.type == "cuda":  # the floor runs uncapped: lift the tiled rows' cap
            torch.cuda.set_per_process_memory_fraction(1.0, device)
        t0 = self.now()
        start = 0
        for size in self.tiles:
            probs = self.head.project(self.hidden[start : start + size]).softmax(dim=-1)
            torch.matmul(probs.to(embed.dtype), embed)
            del probs
            start += size
        sync(device)
        self.times.append(self.now() - t0)
