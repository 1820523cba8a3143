"""What the engine holds in memory between steps, and a run's own memory budget.

`Resident` counts the long-lived bytes by the ledger's terms (dgemma/memory/ledger.py: the weights,
the engine's sampler state, a run's own sampler state, the KV caches) and, on a budgeted CPU
(`VirtualDevice`), reserves them so a step's transient sees only the rest.

A run's `RunOptions.memory_budget` caps its sampler step, counted as an engine started with
that `--memory-budget` would count it: `RunBudget` reports as free the budget minus everything
resident (and never more than the engine's own device has free). The run's sampler plans its
tiles against that, and on a CPU a tile that allocates beyond it raises a real
`torch.OutOfMemoryError`, handled like any other (split the tile, then preempt; or fail the run,
`RunOptions.fail_on_oom`). On CUDA the budget is the allocator's cap while the run's sampler
step runs (a real out-of-memory), and the cap the process had comes back after it. The shared
decoder batch is measured against the engine's own device, not a run's budget.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from dgemma.memory import MemoryDevice, VirtualDevice, format_bytes
from dgemma.memory.ledger import TERMS
from dgemma.memory.tracker import tracked


class Resident:
    """Long-lived bytes on the engine's device, by the ledger's term (a key of `ledger.TERMS`)."""

    def __init__(self, device: MemoryDevice):
        self.device = device
        self.by_term = {key: 0 for key, _ in TERMS if key != "reserve"}  # the runtime's is outside what we count

    @property
    def bytes(self) -> int:
        return sum(self.by_term.values())

    def hold(self, nbytes: int, term: str) -> None:
        """Hold `nbytes` under `term`; `torch.OutOfMemoryError` when a budgeted device cannot."""
        if isinstance(self.device, VirtualDevice):
            self.device.reserve(nbytes, dict(TERMS)[term])
        self.by_term[term] += nbytes

    def give_back(self, nbytes: int, term: str) -> None:
        if isinstance(self.device, VirtualDevice):
            self.device.release(nbytes)
        self.by_term[term] -= nbytes

    def resize(self, held: int, nbytes: int, term: str) -> int:
        """Change a holding under `term` from `held` to `nbytes` bytes; returns `nbytes`."""
        if nbytes > held:
            self.hold(nbytes - held, term)
        else:
            self.give_back(held - nbytes, term)
        return nbytes

    def refuse_to_start(self, nbytes: int, what: str) -> str:
        """One sentence: the budget cannot hold `what` at all."""
        cap = self.device.capacity_bytes() or 0
        return (f"the memory budget of {format_bytes(cap)} is too small for {what} ({format_bytes(nbytes)}, "
                f"{format_bytes(self.device.free_bytes())} left)")


def cache_bytes(cache) -> int:
    """Bytes of one request's KV cache (a DynamicCache)."""
    return sum(layer.keys.untyped_storage().nbytes() + layer.values.untyped_storage().nbytes()
               for layer in cache.layers if getattr(layer, "keys", None) is not None)


class RunBudget(MemoryDevice):
    """The engine's device as a run with its own budget sees it (see the module docstring)."""

    def __init__(self, device: MemoryDevice, budget: int, resident: Resident):
        self.device = device
        self.budget = budget
        self.resident = resident
        self.name = device.name

    def capacity_bytes(self) -> int | None:
        return self.budget

    def free_bytes(self) -> int:
        return max(0, min(self.device.free_bytes(), self.budget - self.resident.bytes))

    @contextlib.contextmanager
    def measure(self):
        if isinstance(self.device, VirtualDevice) or self.device.name == "cpu":
            with self._measure_on_cpu() as m:
                yield m
        else:
            with self._capped_on_cuda(), self.device.measure() as m:
                yield m

    @contextlib.contextmanager
    def _capped_on_cuda(self) -> Iterator[None]:
        # Only the engine's thread allocates on its device, and only inside a step: a cap set for
        # this run's sampler call holds back no other work, so no exclusive mode is needed.
        device = self.device.device
        torch.cuda.empty_cache()  # blocks cached by other work would let the step past its cap unseen
        total = torch.cuda.get_device_properties(device).total_memory
        before = torch.cuda.get_per_process_memory_fraction(device)
        limit = torch.cuda.memory_reserved(device) + self.free_bytes()
        torch.cuda.set_per_process_memory_fraction(min(before, limit / total), device)
        try:
            yield
        finally:
            torch.cuda.set_per_process_memory_fraction(before, device)
            torch.cuda.empty_cache()

    @contextlib.contextmanager
    def _measure_on_cpu(self) -> Iterator:
        limit = self.free_bytes()
        with self.device.measure() as m, tracked(m, limit):
            yield m
