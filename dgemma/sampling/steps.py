"""The step implementations, by name: the one table the rest of the project chooses from."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch

from dgemma.sampling.chunked import choose_chunk_size, chunked_tile
from dgemma.sampling.params import SAMPLER_STEPS
from dgemma.sampling.primitives import LMHead, TileFn
from dgemma.sampling.reference import reference_tile


@dataclass(frozen=True)
class StepLayout:
    """What a step implementation may size itself from when a sampler is built."""

    max_num_seqs: int
    canvas_length: int
    vocab_size: int
    free_bytes: int
    embed_weight: torch.Tensor
    lm_head: LMHead | None
    fraction: float
    chunk_size: int | None  # the chunked step's vocab chunk; None: from free memory


def _reference(layout: StepLayout) -> TileFn:
    return reference_tile


def _chunked(layout: StepLayout) -> TileFn:
    chunk_size = layout.chunk_size
    if chunk_size is None:
        chunk_size = choose_chunk_size(
            layout.vocab_size, layout.canvas_length, layout.max_num_seqs, layout.free_bytes,
            layout.embed_weight, layout.lm_head, layout.fraction,
        )  # fmt: skip
    elif chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    return functools.partial(chunked_tile, chunk_size=chunk_size)


# reference: eager, the one that runs out of memory (the lesson's); chunked: streams the vocabulary.
# Each name in params.SAMPLER_STEPS is built by the function of that name here.
STEPS: dict[str, Callable[[StepLayout], TileFn]] = {name: globals()[f"_{name}"] for name in SAMPLER_STEPS}


def step_for(name: str, layout: StepLayout) -> TileFn:
    """The tile function of step implementation `name`, sized for `layout`."""
    if name not in STEPS:
        raise ValueError(f"unknown sampler {name!r}: choose from {', '.join(SAMPLER_STEPS)}")
    return STEPS[name](layout)
