"""Memory: how much is free, how much a step needs, and how to tile it.

units (sizes), device (the interface), tracker (bytes an op allocates), virtual (a CPU with a
budget), probes (CPU and CUDA, and choosing one), planner (calibration and tile sizes).
"""

from dgemma.memory.device import Measurement, MemoryDevice
from dgemma.memory.planner import Calibration, calibrate, plan_tiles, split_tiles
from dgemma.memory.probes import CudaMemory, HostMemory, memory_for, resolve_device
from dgemma.memory.tracker import TransientTracker, measure_peak, raise_out_of_memory
from dgemma.memory.units import GiB, MiB, format_bytes, parse_size
from dgemma.memory.virtual import VirtualDevice

__all__ = [
    "Calibration", "CudaMemory", "GiB", "HostMemory", "Measurement", "MemoryDevice", "MiB", "TransientTracker",
    "VirtualDevice", "calibrate", "format_bytes", "measure_peak", "memory_for", "parse_size", "plan_tiles",
    "raise_out_of_memory", "resolve_device", "split_tiles",
]  # fmt: skip
