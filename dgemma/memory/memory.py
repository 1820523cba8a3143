"""Memory you can see: free-memory probes, the transient tracker, calibration, and the tile planner.

Three devices answer the same two questions, "how many bytes are free?" and "what did this
region allocate at its peak?":

- `CudaMemory`: the real allocator (`torch.cuda.mem_get_info`, honouring a per-process cap set
  with `torch.cuda.set_per_process_memory_fraction`, so an out-of-memory is real and catchable);
- `HostMemory`: a CPU with no budget (psutil's available RAM);
- `VirtualDevice`: a CPU with a budget. Live tensor bytes are counted by a `TorchDispatchMode`,
  and going over the capacity raises `torch.OutOfMemoryError`: the same exception, the same
  recovery path, as a CUDA out-of-memory. This is how a laptop teaches the lesson.
"""

from __future__ import annotations

import contextlib
import math
import re
import threading
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import psutil
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

MiB = 1024**2
GiB = 1024**3

_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "kib": 1024,
    "m": 1000**2, "mb": 1000**2, "mib": 1024**2,
    "g": 1000**3, "gb": 1000**3, "gib": 1024**3,
    "t": 1000**4, "tb": 1000**4, "tib": 1024**4,
}  # fmt: skip
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(text: str | int) -> int:
    """'8GiB' -> 8589934592. Accepts B, KB/KiB, MB/MiB, GB/GiB, TB/TiB (case-insensitive)."""
    if isinstance(text, int) and not isinstance(text, bool):
        if text <= 0:
            raise ValueError(f"memory size must be positive, got {text}")
        return text
    match = _SIZE.match(str(text))
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _UNITS:
        raise ValueError(f"malformed size {str(text)!r}: use a number and a unit, e.g. 8GiB, 512MiB, 2GB")
    value = float(match.group(1)) * _UNITS[unit]
    if not math.isfinite(value) or value < 1:
        raise ValueError(f"memory size must be at least one byte, got {text!r}")
    return int(value)


def format_bytes(n: float) -> str:
    """Bytes for people: 28672 MiB reads better than 30064771072."""
    if abs(n) >= GiB:
        return f"{n / GiB:.2f} GiB"
    if abs(n) >= MiB:
        return f"{n / MiB:.1f} MiB"
    if abs(n) >= 1024:
        return f"{n / 1024:.0f} KiB"
    return f"{int(n)} B"


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


@dataclass
class Measurement:
    """What a tracked region allocated above its starting point (None: not measured)."""

    peak_bytes: int | None = None


class MemoryDevice:
    """The interface the planner and the sampler use: free bytes, capacity, and a measured region."""

    name: str = "device"

    def free_bytes(self) -> int:
        raise NotImplementedError

    def capacity_bytes(self) -> int | None:
        """The budget the user sees (virtual capacity or CUDA cap); None for the whole device."""
        return None

    @contextlib.contextmanager
    def measure(self) -> Iterator[Measurement]:
        """Measure the peak bytes allocated inside the block (above what was live at entry)."""
        raise NotImplementedError
        yield  # pragma: no cover


class HostMemory(MemoryDevice):
    """A CPU with no budget: free is psutil's available RAM.

    Tracking every op costs real time (a dispatch mode on every call), and with no budget
    nothing depends on it, so by default `measure()` leaves `peak_bytes` unset and the sampler
    reports its calibrated estimate; `track=True` measures (the benchmarks use it).
    """

    name = "cpu"

    def __init__(self, track: bool = False):
        self.track = track

    def free_bytes(self) -> int:
        return int(psutil.virtual_memory().available)

    @contextlib.contextmanager
    def measure(self) -> Iterator[Measurement]:
        m = Measurement()
        if not self.track:
            yield m
            return
        with TransientTracker() as tracker:
            try:
                yield m
            finally:
                m.peak_bytes = tracker.peak


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
        m = Measurement()
        limit = self.free_bytes()
        with TransientTracker(limit=limit, on_change=self._on_change) as tracker:
            try:
                yield m
            finally:
                m.peak_bytes = tracker.peak


class CudaMemory(MemoryDevice):
    """The real allocator. Free bytes honour a per-process cap (set_per_process_memory_fraction)."""

    name = "cuda"

    def __init__(self, device: torch.device | str = "cuda", fraction: float | None = None):
        self.device = torch.device(device)
        if fraction is not None:
            torch.cuda.set_per_process_memory_fraction(fraction, self.device)
        self.fraction = fraction

    def capacity_bytes(self) -> int | None:
        if self.fraction is None:
            return None
        return int(torch.cuda.get_device_properties(self.device).total_memory * self.fraction)

    def free_bytes(self) -> int:
        free, _total = torch.cuda.mem_get_info(self.device)
        allocated = torch.cuda.memory_allocated(self.device)
        # Blocks the caching allocator holds but nobody uses are free to us too.
        free += torch.cuda.memory_reserved(self.device) - allocated
        cap = self.capacity_bytes()
        if cap is not None:
            free = min(free, cap - allocated)
        return max(0, int(free))

    @contextlib.contextmanager
    def measure(self) -> Iterator[Measurement]:
        m = Measurement()
        start = torch.cuda.memory_allocated(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        try:
            yield m
        finally:
            m.peak_bytes = max(0, torch.cuda.max_memory_allocated(self.device) - start)


def memory_for(device: torch.device | str, budget: int | str | None = None) -> MemoryDevice:
    """The memory device for a torch device and an optional budget ('8GiB').

    On CUDA a budget becomes a per-process cap (a real, catchable OOM); on a CPU it becomes a
    `VirtualDevice`; with no budget, a CPU is plain host memory.
    """
    device = torch.device(device)
    if device.type == "cuda":
        fraction = None
        if budget is not None:
            total = torch.cuda.get_device_properties(device).total_memory
            fraction = min(1.0, parse_size(budget) / total)
        return CudaMemory(device, fraction)
    if device.type in ("cpu", "meta"):
        return VirtualDevice(budget) if budget is not None else HostMemory()
    raise ValueError(f"unknown device {str(device)!r}: use cpu or cuda")


def resolve_device(name: str) -> torch.device:
    """'auto' | 'cpu' | 'cuda' | 'cuda:N' | 'meta' -> torch.device, with one clear error line."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ValueError(f"unknown device {name!r}: use auto, cpu or cuda") from None
    if device.type not in ("cpu", "cuda", "meta"):
        raise ValueError(f"unknown device {name!r}: use auto, cpu or cuda")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' asked for, but this machine has no CUDA GPU")
    return device


# --------------------------------------------------------------------------- calibration


@dataclass(frozen=True)
class Calibration:
    """Transient bytes of one sampler call: `fixed + per_request * n` for a tile of n requests."""

    bytes_per_request: int
    fixed_bytes: int
    canvas_length: int
    vocab_size: int

    @property
    def copies_per_request(self) -> float:
        """How many fp32 [CL, vocab] tensors one request keeps alive at the peak."""
        return self.bytes_per_request / (self.canvas_length * self.vocab_size * 4)

    def tile_bytes(self, n: int) -> int:
        return self.fixed_bytes + self.bytes_per_request * n


def measure_peak(run: Callable[[], object]) -> int:
    """Peak bytes `run()` allocates, counted by the tracker (works on meta tensors: no RAM used)."""
    with TransientTracker() as tracker:
        run()
    return tracker.peak


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


# --------------------------------------------------------------------------- the planner


def plan_tiles(
    num_decode: int,
    free_bytes: int,
    calibration: Calibration,
    fraction: float = 0.5,
) -> int:
    """Largest group of requests whose step fits `fraction` of free memory; never below 1.

    Raises `torch.OutOfMemoryError` naming bytes needed and free when even one request cannot
    fit in all of free memory: tiling cannot help then, and the caller should say so.
    """
    if num_decode <= 0:
        return 0
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction must be in (0, 1], got {fraction}")
    one = calibration.tile_bytes(1)
    if one > free_bytes:
        raise_out_of_memory(one, free_bytes, "one request's sampler step")
    usable = int(free_bytes * fraction) - calibration.fixed_bytes
    group = usable // calibration.bytes_per_request
    return int(max(1, min(num_decode, group)))


def split_tiles(num_decode: int, group: int) -> list[tuple[int, int]]:
    """[(start, end), ...] covering 0..num_decode in tiles of `group` (the last may be smaller)."""
    return [(s, min(s + group, num_decode)) for s in range(0, num_decode, group)]
