"""Memory: how much is free, how much a step needs, and how to tile it."""

from dgemma.memory.memory import (
    Calibration,
    CudaMemory,
    HostMemory,
    MemoryDevice,
    MiB,
    TransientTracker,
    VirtualDevice,
    calibrate,
    format_bytes,
    measure_peak,
    memory_for,
    parse_size,
    plan_tiles,
    raise_out_of_memory,
    resolve_device,
    split_tiles,
)

__all__ = [
    "Calibration", "CudaMemory", "HostMemory", "MemoryDevice", "MiB", "TransientTracker", "VirtualDevice",
    "calibrate", "format_bytes", "measure_peak", "memory_for", "parse_size", "plan_tiles",
    "raise_out_of_memory", "resolve_device", "split_tiles",
]  # fmt: skip
