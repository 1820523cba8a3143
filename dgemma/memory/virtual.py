"""The virtual device: a CPU with a memory budget that runs out of memory for real.

Live tensor bytes are counted by the transient tracker, and going over the capacity raises
`torch.OutOfMemoryError`: the same exception, the same recovery path, as a CUDA out-of-memory.
This is how a laptop teaches the lesson.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

from dgemma.memory.device import Measurement, MemoryDevice
from dgemma.memory.ledger import raise_out_of_memory
from dgemma.memory.tracker import tracked
from dgemma.units import parse_size


class VirtualDevice(MemoryDevice):
    """A CPU with a budget: `capacity` bytes, of which `resident` are held (weights, caches).

    Everything allocated inside `measure()` counts against the rest; over the capacity it
    raises `torch.OutOfMemoryError`. Thread-safe: one engine thread allocates, UI threads read.
    """

    name = "virtual"

    def __init__(self, capacity: int | str):
        self.capacity = parse_size(capacity)
        self.resident = 0
        self.transient = 0  # bytes live inside measure() right now
        self.peak_total = 0  # high-water mark of resident + transient
        self._lock = threading.Lock()

    def capacity_bytes(self) -> int | None:
        return self.capacity

    def reserve(self, nbytes: int, what: str) -> None:
        """Hold `nbytes` for long-lived state (weights, KV cache); OOM if it does not fit."""
        with self._lock:
            free = self.capacity - self.resident - self.transient
            if nbytes > free:
                raise_out_of_memory(nbytes, free, what)
            self.resident += nbytes
            self.peak_total = max(self.peak_total, self.resident + self.transient)

    def release(self, nbytes: int) -> None:
        with self._lock:
            self.resident = max(0, self.resident - nbytes)

    def free_bytes(self) -> int:
        with self._lock:
            return max(0, self.capacity - self.resident - self.transient)

    def _on_change(self, delta: int) -> None:
        with self._lock:
            self.transient += delta
            self.peak_total = max(self.peak_total, self.resident + self.transient)

    @contextlib.contextmanager
    def measure(self) -> Iterator[Measurement]:
        with tracked(Measurement(), self.free_bytes(), self._on_change) as m:
            yield m
