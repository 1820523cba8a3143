"""The sampler's side of the memory ledger (dgemma/memory/ledger.py): the calibration of a step for a
model known by its facts, and the ledger of one call (its prompts, settings and run options)."""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch

from dgemma.memory import Calibration
from dgemma.memory.ledger import Ledger, ModelFacts, RunShape, run_ledger, suggested_budget
from dgemma.sampling.blocks import num_blocks
from dgemma.sampling.calibration import calibrate_tile, row_kind
from dgemma.sampling.chunked import chunk_ladder, chunked_tile
from dgemma.sampling.params import RunOptions, SamplingParams
from dgemma.sampling.primitives import LMHead
from dgemma.sampling.reference import reference_tile


def calibration_for(facts: ModelFacts, vocab_size: int | None = None, impl: str = "reference", kind: str = "sample",
                    chunk: int | None = None) -> Calibration:  # fmt: skip
    """The ledger's tile term for a model known by its facts: `impl`'s step as the engine builds it (hidden
    states in, the LM head per tile), at `vocab_size` (above the model's: padded), for `kind`'s rows
    (`calibration.COSTLIEST`), laid out as on `facts.device`; measured on meta tensors, no memory touched.

    The chunked step at `chunk` (None: the narrowest, the least it can hold) is measured over two chunks
    of the vocabulary: each chunk's tensors are freed before the next and its accumulators are [CL] or
    [CL, hidden], so the peak grows with the chunks only by the block race's noise, one float32 per vocab
    block and position (sampling/blocks.py), which is added for the blocks not measured: the rest of what
    all of them would hold, in a sixteenth of the time at vocab 262,144 (tests/test_plan.py checks it)."""
    vocab = vocab_size or facts.vocab_size
    dtype, device = getattr(torch, facts.embed_dtype), torch.device(facts.device)
    measured, step, noise = vocab, reference_tile, 0
    if impl == "chunked":
        chunk = chunk or chunk_ladder(vocab)[-1]
        measured, step = min(vocab, 2 * chunk), functools.partial(chunked_tile, chunk_size=chunk)
        noise = facts.canvas_length * (num_blocks(vocab) - num_blocks(measured)) * 4
    embed = torch.empty(measured, facts.hidden_size, dtype=dtype, device="meta")
    rows = min(facts.vocab_size, measured)
    head = LMHead(torch.empty(rows, facts.hidden_size, dtype=dtype, device="meta"), facts.softcap, measured)
    calibration = calibrate_tile(step, facts.canvas_length, measured, embed, head, device=device, kind=kind)
    return Calibration(calibration.bytes_per_request + noise, calibration.fixed_bytes, facts.canvas_length, vocab)


def call_ledger(facts: ModelFacts, prompt_tokens: Sequence[int], params: SamplingParams, max_new_tokens: int,
                options: RunOptions, default: RunOptions, server_budget: int | None = None) -> tuple[Ledger, int]:  # fmt: skip
    """The ledger of a run of prompts `prompt_tokens` long with one request a tile, against its budget (or the
    server's), and the budget the ledger suggests for it. A run whose options are not the engine's `default`
    builds a sampler of its own; one past the model's vocabulary pads it (the lesson's real scale)."""
    shape = RunShape(tuple(prompt_tokens), -(-max_new_tokens // facts.canvas_length),
                     max(facts.vocab_size, options.pad_vocab or 0), options != default)
    calibration = calibration_for(facts, shape.vocab_size, options.sampler, row_kind(params))
    budget = options.memory_budget or server_budget
    return run_ledger(facts, shape, calibration, budget), suggested_budget(facts, shape, calibration)
