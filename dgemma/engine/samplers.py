"""One tiled sampler per distinct `RunOptions` among the engine's requests, built when first needed.

The decoder runs every denoising canvas as one batch; the sampler step then runs once per
distinct RunOptions over that option's rows (tiling, step implementation, memory budget, whether
an out-of-memory tile fails, and a padded vocabulary are properties of a sampler call, never of
the tokens). Each sampler keeps the per-slot state of the slots whose requests use its options;
slot numbers are the scheduler's, shared by all samplers. The engine's default options' sampler
is built at start and kept; any other is dropped when its last request ends, so what the engine
holds between runs (and a run's budget counts) is the weights and that one sampler.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import torch

from dgemma.engine.resident import Resident, RunBudget
from dgemma.memory import MemoryDevice
from dgemma.memory.ledger import sampler_state_bytes
from dgemma.model.loading import LoadedModel
from dgemma.sampling import LMHead, RunOptions, SamplerConfig, TiledSampler

COMPILE_ENV = "DGEMMA_COMPILE_SAMPLER"  # on | off | auto (default): compile the sampler's tile step


def compiles_sampler(device: torch.device) -> bool:
    """auto: compiled on a dedicated GPU; eager on ZeroGPU (no compiling in its forked worker) and on
    a CPU (where the step is bound by its projections, and compiling costs minutes; docs/benchmarks.md)."""
    choice = os.environ.get(COMPILE_ENV, "auto").strip().lower()
    if choice in ("on", "off"):
        return choice == "on"
    if choice != "auto":
        raise ValueError(f"{COMPILE_ENV} must be on, off or auto, got {choice!r}")
    return torch.device(device).type == "cuda" and not os.environ.get("SPACES_ZERO_GPU")


class SamplerPool:
    def __init__(self, loaded: LoadedModel, max_num_seqs: int, memory: MemoryDevice, resident: Resident,
                 default: RunOptions):
        self.loaded = loaded
        self.max_num_seqs = max_num_seqs
        self.memory = memory
        self.resident = resident
        self.default = default
        # The sampler applies the LM head per tile: the decoder hands it hidden states, so the
        # [n, CL, vocab] logits exist one tile at a time (the point of tiling at a 262k vocab).
        self.head = LMHead(loaded.model.lm_head.weight, loaded.model.final_logit_softcapping)
        self.facts = loaded.ledger_facts(max_num_seqs)
        self._samplers: dict[RunOptions, TiledSampler] = {}
        self._state_bytes: dict[RunOptions, tuple[int, str]] = {}  # bytes held, under which ledger term
        self._slots: dict[RunOptions, set[int]] = {}

    def get(self, options: RunOptions, slot: int | None = None) -> TiledSampler:
        """The sampler for `options` (builds it: torch.OutOfMemoryError when its state does not fit),
        `slot` now one of its requests'."""
        sampler = self._samplers.get(options) or self._build(options)
        if slot is not None:
            self._slots.setdefault(options, set()).add(slot)
        return sampler

    def _build(self, options: RunOptions) -> TiledSampler:
        loaded = self.loaded
        memory = self.memory if options.memory_budget is None else RunBudget(self.memory, options.memory_budget, self.resident)
        sampler = TiledSampler(SamplerConfig(
            self.max_num_seqs, loaded.canvas_length, max(loaded.vocab_size, options.pad_vocab or 0),
            loaded.embed_weight, loaded.embed_scale, memory=memory, tiling=options.tiling, impl=options.sampler,
            lm_head=self.head, split=not options.fail_on_oom, compiled=compiles_sampler(loaded.device),
        ))  # fmt: skip
        # The ledger's figure, which tests/test_ledger.py holds equal to the tensors the sampler allocated.
        nbytes, term = sampler_state_bytes(self.facts, sampler.vocab_size), self._term(options)
        self.resident.hold(nbytes, term)
        self._samplers[options], self._state_bytes[options] = sampler, (nbytes, term)
        return sampler

    def drop(self, options: RunOptions) -> None:
        del self._samplers[options]
        self._slots.pop(options, None)
        self.resident.give_back(*self._state_bytes.pop(options))

    def _term(self, options: RunOptions) -> str:
        return "engine_state" if options == self.default else "run_state"

    def drop_all(self) -> None:
        for options in list(self._samplers):
            self.drop(options)

    def free(self, options: RunOptions, slot: int) -> None:
        sampler = self._samplers.get(options)
        if sampler is None:
            return
        sampler.free(slot)
        users = self._slots.get(options, set())
        users.discard(slot)
        if not users and options != self.default:
            self.drop(options)

    def __getitem__(self, options: RunOptions) -> TiledSampler:
        return self._samplers[options]


def canvases(pool: SamplerPool, rows: list) -> torch.Tensor:
    """[n, CL] the canvases `rows` (requests) denoise next, each from its own sampler, in row order:
    an id of a padded vocabulary (re-noised there) folded back into the model's, as the decoder reads it."""
    vocab = pool.loaded.vocab_size
    return _gather(pool, rows, lambda sampler, slots: sampler.canvas[slots] if sampler.vocab_size == vocab
                   else sampler.canvas[slots] % vocab)


def soft_embeds(pool: SamplerPool, rows: list) -> torch.Tensor:
    """[n, CL, hidden] the self-conditioning input of `rows` (zeros on a canvas's first step)."""
    return _gather(pool, rows, lambda sampler, slots: sampler.soft_embeds(slots))


def _gather(pool: SamplerPool, rows: list, read: Callable[[TiledSampler, list[int]], torch.Tensor]) -> torch.Tensor:
    groups = by_options(rows)
    parts = [read(pool[options], [rows[i].slot for i in index]) for options, index in groups.items()]
    if len(parts) == 1:
        return parts[0]  # one options (the usual case): already in row order
    order = [i for index in groups.values() for i in index]
    out = torch.cat(parts)
    inverse = torch.empty(len(order), dtype=torch.long)
    inverse[torch.tensor(order)] = torch.arange(len(order))
    return out[inverse.to(out.device)]


def by_options(rows: list) -> dict[RunOptions, list[int]]:
    """Row indices grouped by their RunOptions, in first-seen order."""
    groups: dict[RunOptions, list[int]] = {}
    for i, req in enumerate(rows):
        groups.setdefault(req.options, []).append(i)
    return groups
