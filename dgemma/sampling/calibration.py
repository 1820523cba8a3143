"""Measuring a step implementation's transient memory on meta tensors (shapes, no RAM)."""

from __future__ import annotations

import functools
from dataclasses import replace

import torch

from dgemma.memory import Calibration, calibrate
from dgemma.sampling.keyed import RowKey
from dgemma.sampling.params import SamplingParams
from dgemma.sampling.primitives import MAX_STABILITY, LMHead, Phase, Scores, TileFn, TileInputs, group_bytes_for
from dgemma.sampling.schedulers import scheduler_for
from dgemma.sampling.schedulers.block_refinement import BlockRefinementParams
from dgemma.sampling.schedulers.discrete_ddim import DiscreteDDIMParams

# The rows a tile is sized for, by their costliest step (`DenoisingScheduler.row_kind`): (params,
# forward). "sample": the entropy bound's sampling row (greedy rows and block refinement's and DDIM's
# at temperature 0 cost no more); "tempered": a raw-reading row at a temperature (a second pass over
# the vocabulary); "sweep": a corrector sweep (its logits whole, in float64).
COSTLIEST = {
    "sample": (SamplingParams(), 0),
    "tempered": (SamplingParams(scheduler=BlockRefinementParams(temperature=1.0)), 0),
    "sweep": (SamplingParams(scheduler=DiscreteDDIMParams(corrector_steps=1), max_denoising_steps=4), 1),
}


def row_kind(params: SamplingParams) -> str:
    """The costliest row (a key of `COSTLIEST`) a request with `params` ever puts in a tile."""
    return scheduler_for(params).row_kind(params)


def meta_tile_inputs(n: int, canvas_length: int, group_bytes: int | None = None, kind: str = "sample") -> TileInputs:
    """Tile inputs on the meta device: shapes without values, for measuring memory at any scale, of
    n rows of `kind`'s costliest row (`COSTLIEST`)."""
    meta = torch.device("meta")
    params, forward = COSTLIEST[kind]
    sweep = forward > 0
    scheduled = {} if kind == "sample" else dict(
        params=[params] * n, phases=[Phase(0, 3, int(sweep))] * n,
        canvas=torch.empty(n, canvas_length, dtype=torch.long, device=meta),
        committed=torch.empty(n, canvas_length, dtype=torch.bool, device=meta))  # fmt: skip
    return TileInputs(
        rows=[RowKey(0, 0, forward, False, params.scheduler.name, sweep, scheduler_for(params).reads_raw)] * n, **scheduled,
        temperature=torch.empty(n, device=meta), entropy_bound=torch.empty(n, device=meta),
        confidence_threshold=torch.empty(n, device=meta), last_step=torch.empty(n, dtype=torch.bool, device=meta),
        history=torch.empty(n, MAX_STABILITY, canvas_length, dtype=torch.long, device=meta),
        history_valid=torch.empty(n, MAX_STABILITY, dtype=torch.bool, device=meta), group_bytes=group_bytes,
    )  # fmt: skip


def calibrate_tile(tile_fn: TileFn, canvas_length: int, vocab_size: int, embed_weight: torch.Tensor,
                   lm_head: LMHead | None = None, device: torch.device | None = None, kind: str = "sample") -> Calibration:
    """Measure `tile_fn`'s transient on meta tensors at the real shapes (no RAM, milliseconds).

    With an `lm_head` the tile takes hidden states and its projection's output counts as
    transient; without, the logits are the caller's input and do not. The tile is laid out as it
    runs on `device` (default: `embed_weight`'s; `group_bytes_for`): a CPU's groups of positions,
    a GPU's all at once. `kind`: whose costliest row the tile holds (`COSTLIEST`).
    """
    group_bytes = group_bytes_for(embed_weight.device if device is None else device)
    head_shape = None if lm_head is None else (*lm_head.weight.shape, lm_head.weight.dtype, lm_head.softcap, lm_head.vocab_size)
    key = (_step_key(tile_fn), canvas_length, vocab_size, *embed_weight.shape, embed_weight.dtype, head_shape, group_bytes, kind)
    if key not in _MEASURED:  # a measurement is of shapes only: the same shapes measure the same
        _MEASURED[key] = _measure(tile_fn, canvas_length, vocab_size, embed_weight, lm_head, group_bytes, kind)
    return _MEASURED[key]


# Calibrations by everything they depend on: each sampler the engine, the lesson or a bench builds
# for shapes already measured takes the measurement (about a second of dispatch on meta tensors).
_MEASURED: dict[tuple, Calibration] = {}


def _step_key(tile_fn: TileFn) -> object:
    """A step implementation as a key: a functools.partial by its function and arguments."""
    if isinstance(tile_fn, functools.partial):
        return tile_fn.func, tile_fn.args, tuple(sorted(tile_fn.keywords.items()))
    return tile_fn


def _measure(tile_fn: TileFn, canvas_length: int, vocab_size: int, embed_weight: torch.Tensor, lm_head: LMHead | None,
             group_bytes: int | None, kind: str) -> Calibration:
    meta = torch.device("meta")
    embed = torch.empty(embed_weight.shape, dtype=embed_weight.dtype, device=meta)
    head = None if lm_head is None else replace(lm_head, weight=torch.empty(lm_head.weight.shape, dtype=lm_head.weight.dtype, device=meta))

    def prepare(n: int):
        if head is None:
            scores = Scores(logits=torch.empty(n, canvas_length, vocab_size, dtype=torch.float32, device=meta))
        else:
            scores = Scores(hidden=torch.empty(n, canvas_length, head.weight.shape[1], dtype=head.weight.dtype, device=meta), head=head)
        inputs = meta_tile_inputs(n, canvas_length, group_bytes, kind)
        return lambda: tile_fn(scores, inputs, embed, 1.0)

    return calibrate(prepare, canvas_length, vocab_size)
