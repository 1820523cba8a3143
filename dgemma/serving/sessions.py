"""Who is running what: each browser session's runs, so Stop and the limits stay per session.

Gradio gives every browser tab its own `session_hash`. A run (one click of Run, or one API call)
registers under it; Stop cancels only that session's runs, and the per-session cap on queued
requests is checked here, so one tab cannot fill the engine's queue for everybody.
"""

from __future__ import annotations

import logging
import threading
from typing import Protocol

log = logging.getLogger(__name__)


class Cancellable(Protocol):
    size: int  # requests in the run

    def cancel(self) -> None: ...


class Sessions:
    def __init__(self, max_queued: int):
        self.max_queued = max_queued
        self._runs: dict[str, list[Cancellable]] = {}
        self._lock = threading.Lock()

    def pending(self, session: str) -> int:
        with self._lock:
            return sum(r.size for r in self._runs.get(session, []))

    def add(self, session: str, run: Cancellable) -> None:
        """Register `run`, or raise ValueError (one sentence) if it would pass the session's cap."""
        with self._lock:
            runs = self._runs.setdefault(session, [])
            held = sum(r.size for r in runs)
            if held + run.size > self.max_queued:
                if not runs:
                    self._runs.pop(session, None)
                raise ValueError(
                    f"This session already has {held} requests waiting or running and {run.size} more "
                    f"would pass its limit of {self.max_queued}; wait for them or press Stop."
                )
            runs.append(run)

    def remove(self, session: str, run: Cancellable) -> None:
        with self._lock:
            runs = self._runs.get(session, [])
            if run in runs:
                runs.remove(run)
            if not runs:
                self._runs.pop(session, None)

    def cancel(self, session: str) -> int:
        """Cancel every run of `session`; returns how many requests were asked to stop."""
        with self._lock:
            runs = list(self._runs.get(session, []))
        for run in runs:
            run.cancel()
        return sum(r.size for r in runs)


def client_left(cancelled: int, how: str) -> None:
    """The one log line for requests cancelled because their client went away (none: no line)."""
    if cancelled:
        log.info("client left (%s): cancelled %d unfinished requests", how, cancelled)
