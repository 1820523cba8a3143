"""The memory-device interface: free bytes, capacity, and the peak of a measured region."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass


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

    def measure(self) -> contextlib.AbstractContextManager[Measurement]:
        """Measure the peak bytes allocated inside the block (above what was live at entry)."""
        raise NotImplementedError
