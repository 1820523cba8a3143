"""Fault injection for the reliability tests, from outside the engine: wrappers, no engine hooks.

`install_faults(core)` wraps the core's runner (held by its one owner, the execute phase) and its
`step`; set the returned `Faults`' attributes from any thread:

- decoder_oom_above: a decoder call with more rows than this raises out-of-memory;
- nan_requests: these request ids get NaN hidden states (so NaN logits) from their next decoder call;
- crash_steps: the next this-many core steps raise (inside the engine thread, if one drives it);
- kv_oom_after_append: the next this-many KV caches that grew by a commit run out of memory as their
  new bytes are held (the cache holds the commit already: a retry must not append it again).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import torch

from dgemma.engine import EngineCore


@dataclass
class Faults:
    decoder_oom_above: int | None = None
    nan_requests: set[int] = field(default_factory=set)
    crash_steps: int = 0
    kv_oom_after_append: int = 0
    appended: bool = False  # a KV cache grew since the last holding of KV-cache bytes


class FaultyRunner:
    """A Runner whose decoder runs out of memory above a row count, or returns NaN for some requests."""

    def __init__(self, runner, core: EngineCore, faults: Faults):
        self._runner = runner
        self._core = core
        self._faults = faults

    def __getattr__(self, name):
        return getattr(self._runner, name)

    def decode(self, canvases, soft_embeds, has_soft, caches, hidden_only=False):
        limit = self._faults.decoder_oom_above
        if limit is not None and len(caches) > limit:
            raise torch.OutOfMemoryError(f"injected out of memory: decoder batch of {len(caches)} > {limit}")
        out = self._runner.decode(canvases, soft_embeds, has_soft, caches, hidden_only=hidden_only)
        if self._faults.nan_requests:
            owner = {id(r.cache): r.id for r in self._core.scheduler.running.values()}
            for i, cache in enumerate(caches):
                if owner.get(id(cache)) in self._faults.nan_requests:
                    out[i] = float("nan")
        return out

    def append_to_cache(self, cache, tokens):
        self._runner.append_to_cache(cache, tokens)
        self._faults.appended = True


def install_faults(core: EngineCore) -> Faults:
    """Wrap `core`'s runner and step with injectable faults (all off until set)."""
    faults = Faults()
    core.phases.runner = FaultyRunner(core.phases.runner, core, faults)
    step = core.step

    @functools.wraps(step)
    def crashing_step():
        if faults.crash_steps > 0:
            faults.crash_steps -= 1
            raise RuntimeError("injected engine crash")
        return step()

    core.step = crashing_step
    hold = core.resident.hold

    def holding(nbytes: int, term: str) -> None:
        grew, faults.appended = faults.appended, False
        if term == "kv_caches" and grew and faults.kv_oom_after_append > 0:
            faults.kv_oom_after_append -= 1
            raise torch.OutOfMemoryError("injected out of memory: a KV cache's commit")
        hold(nbytes, term)

    core.resident.hold = holding
    return faults
