"""The decoder's and the sampler's shares of a step, timed without a GPU→CPU sync of their own.

On CUDA a clock read after a kernel launch measures the launch, not the work; waiting for the
device after each decoder call (`torch.cuda.synchronize`) made the times honest but stalled the
host once a step for no other reason. Here each interval is a pair of CUDA events recorded on the
stream, and their times are read once a step after the step's own host copy (the sampler's
outputs, which the engine copies to the host anyway): by then every event recorded before that
copy has happened, so reading them waits for nothing. On a CPU the work is done when the call
returns, so the marks are `time.perf_counter()` and the same queue settles them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch


@dataclass
class Shares:
    """The engine's total seconds in each share, since it started (the engine's stats read them)."""

    decoder_seconds: float = 0.0
    sampler_seconds: float = 0.0


class ShareClock:
    """`mark()` a point in the device's work; `charge(start, end, rows, name)` the interval to the
    engine's total `name` (`totals`) and each row's counter `name`; `settle()` after a host copy
    adds them all up."""

    def __init__(self, device: torch.device):
        self.cuda = torch.device(device).type == "cuda"
        self.totals = Shares()
        self.pending: list[tuple[object, object, list, str]] = []

    def mark(self) -> object:
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def charge(self, start: object, end: object, rows: list, name: str) -> None:
        self.pending.append((start, end, list(rows), name))

    def settle(self) -> None:
        """Add every charged interval. After a host copy that follows their end marks the events have
        all happened and the wait below returns at once; without one (every row left) it waits."""
        if self.cuda and self.pending:
            self.pending[-1][1].synchronize()  # type: ignore[attr-defined]  # the last mark: all before it are done
        for start, end, rows, name in self.pending:
            seconds = start.elapsed_time(end) / 1000.0 if self.cuda else end - start  # type: ignore[attr-defined]
            setattr(self.totals, name, getattr(self.totals, name) + seconds)
            for row in rows:
                setattr(row, name, getattr(row, name) + seconds)
        self.pending.clear()
