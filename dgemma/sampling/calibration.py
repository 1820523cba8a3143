"""Measuring a step implementation's transient memory on meta tensors (shapes, no RAM)."""

from __future__ import annotations

from dataclasses import replace

import torch

from dgemma.memory import Calibration, calibrate
from dgemma.sampling.keyed import RowKey
from dgemma.sampling.primitives import MAX_STABILITY, LMHead, Scores, TileFn, TileInputs, group_bytes_for


def meta_tile_inputs(n: int, canvas_length: int, group_bytes: int | None = None) -> TileInputs:
    """Tile inputs on the meta device: shapes without values, for measuring memory at any scale.
    Every row samples (greedy rows draw no noise), so the measure is the costlier case."""
    meta = torch.device("meta")
    return TileInputs(
        rows=[RowKey(0, 0, 0)] * n,
        temperature=torch.empty(n, device=meta),
        entropy_bound=torch.empty(n, device=meta),
        confidence_threshold=torch.empty(n, device=meta),
        last_step=torch.empty(n, dtype=torch.bool, device=meta),
        history=torch.empty(n, MAX_STABILITY, canvas_length, dtype=torch.long, device=meta),
        history_valid=torch.empty(n, MAX_STABILITY, dtype=torch.bool, device=meta),
        group_bytes=group_bytes,
    )


def calibrate_tile(
    tile_fn: TileFn,
    canvas_length: int,
    vocab_size: int,
    embed_weight: torch.Tensor,
    lm_head: LMHead | None = None,
    device: torch.device | None = None,
) -> Calibration:
    """Measure `tile_fn`'s transient on meta tensors at the real shapes (no RAM, milliseconds).

    With an `lm_head` the tile takes hidden states and its projection's output counts as
    transient; without, the logits are the caller's input and do not. The tile is laid out as it
    runs on `device` (default: `embed_weight`'s; `group_bytes_for`): a CPU's groups of positions,
    a GPU's all at once.
    """
    group_bytes = group_bytes_for(embed_weight.device if device is None else device)
    meta = torch.device("meta")
    embed = torch.empty(embed_weight.shape, dtype=embed_weight.dtype, device=meta)
    head = None if lm_head is None else replace(lm_head, weight=torch.empty(lm_head.weight.shape, dtype=lm_head.weight.dtype, device=meta))

    def prepare(n: int):
        if head is None:
            scores = Scores(logits=torch.empty(n, canvas_length, vocab_size, dtype=torch.float32, device=meta))
        else:
            scores = Scores(hidden=torch.empty(n, canvas_length, head.weight.shape[1], dtype=head.weight.dtype, device=meta), head=head)
        inputs = meta_tile_inputs(n, canvas_length, group_bytes)
        return lambda: tile_fn(scores, inputs, embed, 1.0)

    return calibrate(prepare, canvas_length, vocab_size)
