"""Memory: how much is free, how much a step needs, and how to tile it.

ledger (what a run holds, term by term, and the tile sizes: the one place the terms are added up),
device (the interface), tracker (bytes an op allocates, and a step's calibration), repeats (a loop's
alike bodies counted at the cost of one), virtual (a CPU with a budget), probes (CPU and CUDA, and
choosing one); allocator
(the server process's C allocator, imported on its own by app.py). The units of size (GiB,
format_bytes, parse_size) live in dgemma/units.py, free of torch for the views; they are re-exported here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dgemma import lazy_attributes
from dgemma.units import GiB, MiB, format_bytes, parse_size

if TYPE_CHECKING:
    from dgemma.memory.device import MemoryDevice
    from dgemma.memory.ledger import Calibration, plan_tiles, split_tiles
    from dgemma.memory.probes import CudaMemory, HostMemory, memory_for, resolve_device
    from dgemma.memory.repeats import Repeats
    from dgemma.memory.tracker import TransientTracker, calibrate, measure_peak
    from dgemma.memory.virtual import VirtualDevice

# The sizes are plain Python; everything else imports torch, on first use (the page is served
# before torch has loaded, and its settings need only the sizes).
_LAZY = {
    "MemoryDevice": "device", "Calibration": "ledger", "calibrate": "tracker", "plan_tiles": "ledger",
    "split_tiles": "ledger", "CudaMemory": "probes", "HostMemory": "probes", "memory_for": "probes",
    "resolve_device": "probes", "TransientTracker": "tracker", "measure_peak": "tracker", "VirtualDevice": "virtual",
    "Repeats": "repeats",
}  # fmt: skip
__all__ = ["GiB", "MiB", "format_bytes", "parse_size", *_LAZY]

__getattr__ = lazy_attributes(__name__, _LAZY)
