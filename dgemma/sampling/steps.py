"""The step implementations, by name: the one table the rest of the project chooses from, and the
config a sampler is built from (`SamplerConfig`), its tile function (compiled or not) included."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch

from dgemma.memory import Calibration, MemoryDevice
from dgemma.sampling.chunked import choose_chunk_size, chunked_tile
from dgemma.sampling.params import SAMPLER_STEPS
from dgemma.sampling.primitives import LMHead, TileFn
from dgemma.sampling.reference import reference_tile


@dataclass(frozen=True, eq=False)
class SamplerConfig:
    """What a tiled sampler is built from, complete (`tiled.TiledSampler(config)`), and what its step
    implementation sizes itself from.

    tiling: "auto" (plan tiles from free memory; split a tile that still runs out of memory), "off"
    (one tile) or an int (fixed size); split=False: an out-of-memory tile is the error
    (RunOptions.fail_on_oom). impl: the step implementation (`STEPS`); tile_fn: a step of its own
    instead (the seed's baseline, a test's), named by `impl`; compiled: the step through torch.compile
    (`compiled_tile`). chunk_size: the chunked step's vocab chunk (None: from free memory). fraction:
    the share of free memory a tile may take. lm_head set: the step may take hidden states and project
    them per tile. calibration: the sampling row's transient, known already (None: measured on first use)."""

    max_num_seqs: int
    canvas_length: int
    vocab_size: int
    embed_weight: torch.Tensor
    normalizer: float
    memory: MemoryDevice | None = None  # None: the host's free memory
    tiling: str | int = "auto"
    impl: str = "reference"
    lm_head: LMHead | None = None
    chunk_size: int | None = None
    fraction: float = 0.5
    split: bool = True
    tile_fn: TileFn | None = None
    compiled: bool = False
    calibration: Calibration | None = None


def _chunked(config: SamplerConfig, free_bytes: int) -> TileFn:
    chunk_size = config.chunk_size
    if chunk_size is None:
        chunk_size = choose_chunk_size(config.vocab_size, config.canvas_length, config.max_num_seqs, free_bytes,
                                       config.embed_weight, config.lm_head, config.fraction)
    elif chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    return functools.partial(chunked_tile, chunk_size=chunk_size)


# The names are params.SAMPLER_STEPS (torch-free, for the settings), in its order; a test holds them equal.
STEPS: dict[str, Callable[[SamplerConfig, int], TileFn]] = {
    "reference": lambda config, free_bytes: reference_tile,  # eager, the one that runs out of memory (the lesson's)
    "chunked": _chunked,  # streams the vocabulary
}


def step_for(config: SamplerConfig, free_bytes: int) -> TileFn:
    """The tile function of `config`'s step implementation (or its own), sized for it and `free_bytes`,
    compiled when `config.compiled`."""
    if config.tile_fn is None and config.impl not in STEPS:
        raise ValueError(f"unknown sampler {config.impl!r}: choose from {', '.join(SAMPLER_STEPS)}")
    tile_fn = config.tile_fn or STEPS[config.impl](config, free_bytes)
    return compiled_tile(tile_fn) if config.compiled else tile_fn


def compiled_tile(tile_fn: TileFn) -> TileFn:
    """`tile_fn` through torch.compile (shapes dynamic: a tile's size changes with the plan), except
    on meta tensors or under a dispatch mode (the calibration and the op tracker count the eager ops)."""
    from torch.utils._python_dispatch import _get_current_dispatch_mode

    compiled = torch.compile(tile_fn, dynamic=True)

    def tile(scores, inputs, embed_weight, normalizer):
        if embed_weight.is_meta or _get_current_dispatch_mode() is not None:
            return tile_fn(scores, inputs, embed_weight, normalizer)
        return compiled(scores, inputs, embed_weight, normalizer)

    tile.eager = tile_fn  # type: ignore[attr-defined]
    return tile

