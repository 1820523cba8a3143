"""Sizes: parse '512MiB', print bytes for people, and the binary units (pure Python: the views use it too)."""

from __future__ import annotations

import math
import re

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


def format_bytes(n: float | None) -> str:
    """Bytes for people: 28672 MiB reads better than 30064771072; None (not known, or not run) is "—"."""
    if n is None:
        return "—"
    if abs(n) >= GiB:
        return f"{n / GiB:.2f} GiB"
    if abs(n) >= MiB:
        return f"{n / MiB:.1f} MiB"
    if abs(n) >= 1024:
        return f"{n / 1024:.0f} KiB"
    return f"{int(n)} B"
