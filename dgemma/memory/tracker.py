"""The transient tracker: counts the bytes every op allocates, live and at peak, and can refuse them.

A `TorchDispatchMode` sees every tensor an op returns, so a CPU (or meta tensors) can measure a
region's peak and, with a limit, raise a real `torch.OutOfMemoryError` when it is crossed.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from dgemma.units import format_bytes


def raise_out_of_memory(needed: int, free: int, what: str) -> None:
    raise torch.OutOfMemoryError(
        f"out of memory: {what} needs {format_bytes(needed)} but only {format_bytes(free)} is free"
    )


class TransientTracker(TorchDispatchMode):
    """Counts the bytes of every tensor storage created inside it, live and at peak.

    A storage is counted once when an op first returns it and uncounted when Python frees it
    (a weakref finaliser), so views and in-place ops cost nothing, as on a real allocator.
    With `limit` set, exceeding it raises `torch.OutOfMemoryError` after the op that crossed it;
    the exception drops that op's output, so the bytes come back as they would after a failed
    cudaMalloc. Works on meta tensors too, which is how real-scale shapes are measured without RAM.
    """

    def __init__(self, limit: int | None = None, on_change: Callable[[int], None] | None = None):
        super().__init__()
        self.limit = limit
        self.live = 0
        self.peak = 0
        self._on_change = on_change
        self._lock = threading.Lock()

    def _release(self, nbytes: int) -> None:
        with self._lock:
            self.live -= nbytes
        if self._on_change is not None:
            self._on_change(-nbytes)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        # Storages that reach an op as inputs existed before it: a view of one (a slice of the
        # logits, say) allocates nothing, so mark them seen without counting them.
        for t in tree_flatten((args, kwargs))[0]:
            if isinstance(t, torch.Tensor):
                storage = t.untyped_storage()
                if not getattr(storage, "_dgemma_tracked", False):
                    storage._dgemma_tracked = True
        out = func(*args, **(kwargs or {}))
        fresh = []
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                storage = t.untyped_storage()
                if not getattr(storage, "_dgemma_tracked", False) and all(storage is not f for f in fresh):
                    fresh.append(storage)
        added = sum(storage.nbytes() for storage in fresh)
        if not added:
            return out
        with self._lock:
            if self.limit is not None and self.live + added > self.limit:
                free = max(0, self.limit - self.live)
                refused = True  # a refused allocation is never counted: the output is dropped
            else:
                refused = False
                self.live += added
                self.peak = max(self.peak, self.live)
        if refused:
            raise_out_of_memory(added, free, func.__name__.split(".")[0])
        for storage in fresh:
            storage._dgemma_tracked = True
            weakref.finalize(storage, self._release, storage.nbytes())
        if self._on_change is not None:
            self._on_change(added)
        return out


def measure_peak(run: Callable[[], object]) -> int:
    """Peak bytes `run()` allocates, counted by the tracker (works on meta tensors: no RAM used)."""
    with TransientTracker() as tracker:
        run()
    return tracker.peak
