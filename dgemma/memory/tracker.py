"""The transient tracker: counts the bytes every op allocates, live and at peak, and can refuse them.

A `TorchDispatchMode` sees every tensor an op returns, so a CPU (or meta tensors) can measure a
region's peak and, with a limit, raise a real `torch.OutOfMemoryError` when it is crossed.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import weakref
from collections.abc import Callable, Iterator

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from dgemma.memory.device import Measurement
from dgemma.memory.ledger import Calibration, raise_out_of_memory
from dgemma.units import format_bytes


# op -> which of its returns may be new storages (read once per op): those its schema gives no alias
# annotation. A view (`slice`), an in-place op (`add_`) or an `out=` op returns (a view of) an input:
# nothing new. A few views carry no annotation (`_unsafe_view`, which matmul uses), so a storage that
# is one of the op's inputs' is never new either (`_new_storages`).
@functools.cache
def _fresh_returns(func) -> tuple[bool, ...]:
    return tuple(r.alias_info is None for r in func._schema.returns)


def _tensors(values) -> list[torch.Tensor]:
    """The tensors among an op's arguments or returns (each a tensor, a list of them or neither)."""
    found = []
    for value in values:
        if isinstance(value, torch.Tensor):
            found.append(value)
        elif isinstance(value, (list, tuple)):
            found.extend(t for t in value if isinstance(t, torch.Tensor))
    return found


def distinct_storages(tensors, besides: list = ()) -> list:
    """The distinct storages of `tensors`, leaving out those in `besides`."""
    storages: list = []
    for t in tensors:
        storage = t.untyped_storage()
        if all(storage is not s for s in storages) and all(storage is not s for s in besides):
            storages.append(storage)
    return storages


def _new_storages(out, fresh: tuple[bool, ...], args: tuple, kwargs: dict) -> list:
    """The distinct storages of `out`'s tensors at the fresh return positions that are not an input's."""
    returned = _tensors(value for value, is_fresh in zip(out if isinstance(out, tuple) else (out,), fresh) if is_fresh)
    if not returned:
        return []
    return distinct_storages(returned, [t.untyped_storage() for t in _tensors((*args, *kwargs.values()))])


class TransientTracker(TorchDispatchMode):
    """Counts the bytes of every tensor storage created inside it, live and at peak.

    A storage is counted once, when the op that creates it returns it, and uncounted when it is
    freed (a weak reference's callback), so views and in-place ops cost nothing, as on a real
    allocator. Which returns are new storages is read once per op from its schema (no alias
    annotation): looking at each op's inputs instead cost some 25 us of Python per op, and a
    CPU step in cache groups makes thousands of ops (docs/benchmarks.md). With `limit` set,
    exceeding it raises `torch.OutOfMemoryError` after the op that crossed it; the exception
    drops that op's output, so the bytes come back as they would after a failed cudaMalloc.
    Works on meta tensors too, which is how real-scale shapes are measured without RAM. Trackers
    nest: each counts what is created inside it.
    """

    def __init__(self, limit: int | None = None, on_change: Callable[[int], None] | None = None):
        super().__init__()
        self.limit = limit
        self.live = 0
        self.peak = 0
        self._on_change = on_change
        self._lock = threading.Lock()
        self._held: dict[weakref.ref, int] = {}  # a live counted storage's reference -> its bytes

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # torch wraps a mode's __torch_dispatch__ so that torch.compile never traces into it: a
        # few us on every op, and nothing here is compiled.
        return False

    def _release(self, ref: weakref.ref) -> None:
        with self._lock:
            nbytes = self._held.pop(ref, 0)
            self.live -= nbytes
        if nbytes and self._on_change is not None:
            self._on_change(-nbytes)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        fresh = _fresh_returns(func)
        if any(fresh):
            self.count(_new_storages(out, fresh, args, kwargs), func.__name__.split(".")[0])
        return out

    def count(self, storages: list, what: str) -> None:
        """Count new `storages` as live until each is freed; over the limit, count none of them
        and raise `torch.OutOfMemoryError` naming `what` (the caller drops them)."""
        added = sum(storage.nbytes() for storage in storages)
        if not added:
            return
        self.charge(added, what)
        with self._lock:
            for storage in storages:
                self._held[weakref.ref(storage, self._release)] = storage.nbytes()

    def charge(self, nbytes: int, what: str) -> None:
        """Count `nbytes` as live (until `uncharge`), or raise `torch.OutOfMemoryError` over the limit."""
        with self._lock:
            if self.limit is not None and self.live + nbytes > self.limit:
                free = max(0, self.limit - self.live)
                refused = True  # a refused allocation is never counted: the output is dropped
            else:
                refused = False
                self.live += nbytes
                self.peak = max(self.peak, self.live)
        if refused:
            raise_out_of_memory(nbytes, free, what)
        if self._on_change is not None:
            self._on_change(nbytes)

    def uncharge(self, nbytes: int) -> None:
        with self._lock:
            self.live -= nbytes
        if self._on_change is not None:
            self._on_change(-nbytes)


def measure_peak(run: Callable[[], object]) -> int:
    """Peak bytes `run()` allocates, counted by the tracker (works on meta tensors: no RAM used)."""
    with TransientTracker() as tracker:
        run()
    return tracker.peak


@contextlib.contextmanager
def tracked(m: Measurement, limit: int | None = None,
            on_change: Callable[[int], None] | None = None) -> Iterator[Measurement]:
    """A region measured by a TransientTracker(`limit`, `on_change`): `m`, its `peak_bytes` set when the region ends."""
    with TransientTracker(limit, on_change) as tracker:
        try:
            yield m
        finally:
            m.peak_bytes = tracker.peak


def calibrate(prepare: Callable[[int], Callable[[], object]], canvas_length: int, vocab_size: int) -> Calibration:
    """Measure the step's transient at tiles of 1 and 2 requests and fit `fixed + per_request * n`.

    `prepare(n)` builds the inputs of one sampler tile of n requests at the real (CL, vocab,
    hidden) shapes and returns the call to measure, so the inputs are not counted as transient.
    The sampler builds them on meta tensors: even vocab 262,144 costs no memory.
    """
    one = measure_peak(prepare(1))
    two = measure_peak(prepare(2))
    per_request = max(1, two - one)
    return Calibration(per_request, max(0, one - per_request), canvas_length, vocab_size)
