"""Free-memory probes: three devices answer "how many bytes are free?" and "what did this region
allocate at its peak?".

- `CudaMemory`: the real allocator (`torch.cuda.mem_get_info`, honouring a per-process cap set
  with `torch.cuda.set_per_process_memory_fraction`, so an out-of-memory is real and catchable);
- `HostMemory`: a CPU with no budget (psutil's available RAM);
- `VirtualDevice` (virtual.py): a CPU with a budget.

`memory_for` picks one for a torch device and a budget; `resolve_device` names the torch device.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import psutil
import torch

from dgemma.memory.device import Measurement, MemoryDevice
from dgemma.memory.tracker import tracked
from dgemma.memory.virtual import VirtualDevice
from dgemma.units import parse_size


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

    def measure(self) -> contextlib.AbstractContextManager[Measurement]:
        return tracked(Measurement()) if self.track else contextlib.nullcontext(Measurement())


class CudaMemory(MemoryDevice):
    """The real allocator. Free bytes honour a per-process cap (set_per_process_memory_fraction)."""

    name = "cuda"

    def __init__(self, device: torch.device | str = "cuda", fraction: float | None = None):
        self.device = torch.device(device)
        if fraction is not None:
            torch.cuda.set_per_process_memory_fraction(fraction, self.device)
        self.fraction = fraction

    def capacity_bytes(self) -> int | None:
        return None if self.fraction is None else int(torch.cuda.get_device_properties(self.device).total_memory * self.fraction)

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
        name = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ValueError(f"unknown device {name!r}: use auto, cpu or cuda") from None
    if device.type not in ("cpu", "cuda", "meta"):
        raise ValueError(f"unknown device {name!r}: use auto, cpu or cuda")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' asked for, but this machine has no CUDA GPU")
    if device.type == "cuda" and device.index is None:
        # torch.cuda's memory calls (the per-process cap among them) want an index.
        device = torch.device("cuda", torch.cuda.current_device())
    return device
