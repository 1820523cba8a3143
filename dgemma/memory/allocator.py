"""The C allocator of a long-running server process: glibc's malloc arenas, capped.

glibc gives each new thread that allocates an arena of its own (up to eight per core), and each
arena keeps the memory freed into it for that arena's next allocations. A server's threads
(Gradio's worker pool, the engine's loop, the event loop) then spread the same traffic over many
arenas, memory one arena freed is not reused by another, and resident memory creeps up under
steady traffic. Two arenas are what `MALLOC_ARENA_MAX=2` gives from the shell; the variable, when set,
wins. Elsewhere (macOS, musl) this does nothing.
"""

from __future__ import annotations

import ctypes
import os
import platform

M_ARENA_MAX = -8  # glibc's mallopt parameter (malloc.h)


def cap_malloc_arenas(arenas: int = 2) -> bool:
    """Cap glibc's malloc arenas at `arenas` for this process; True when the cap is set here.
    Call it before threads start allocating (arenas already made stay)."""
    if "MALLOC_ARENA_MAX" in os.environ or platform.libc_ver()[0] != "glibc":
        return False
    mallopt = getattr(ctypes.CDLL(None), "mallopt", None)
    return bool(mallopt and mallopt(M_ARENA_MAX, arenas))
