"""One lesson run on a thread of its own, its events polled as a Run's are, so the page streams the
lesson's board with the same loop as a Generate run (dgemma/serving/runs.py `ticks`): `poll`, `finished`,
then `outcome()`.

The backend's `lesson` blocks until the run ends (the engine's lock held, seconds at most); its
`on_events` puts each step's events here, from the thread running it. A reader that goes away
(closed page) leaves the run to finish on its thread: the lesson is one bounded batch.
"""

from __future__ import annotations

import queue
import threading

from dgemma.events import Event
from dgemma.serving.backend import Backend, LessonOutcome
from dgemma.settings import Settings


class LiveLesson:
    """`backend.lesson(...)` started on a thread; poll its events, then take its outcome."""

    def __init__(self, backend: Backend, requests: int, budget: str | None, real_scale: bool, tiling: str,
                 settings: Settings, impl: str = "reference"):
        self._events: queue.Queue[list[Event]] = queue.Queue()
        self._ended = threading.Event()
        self._outcome: LessonOutcome | None = None
        self._error: BaseException | None = None
        args = (requests, budget, real_scale, tiling, settings, impl)
        threading.Thread(target=self._work, args=(backend, args), name="dgemma-lesson", daemon=True).start()

    def _work(self, backend: Backend, args: tuple) -> None:
        try:
            self._outcome = backend.lesson(*args, on_events=self._events.put)
        except BaseException as err:  # noqa: BLE001 - handed to the reader, who says it in one sentence
            self._error = err
        finally:
            self._ended.set()

    def poll(self, timeout: float) -> list[Event]:
        """The events that arrived within `timeout` seconds (possibly none)."""
        try:
            events = list(self._events.get(timeout=max(0.0, timeout)))
        except queue.Empty:
            return []
        while True:
            try:
                events.extend(self._events.get_nowait())
            except queue.Empty:
                return events

    def finished(self) -> bool:
        """The run has ended and every event it sent has been polled."""
        return self._ended.is_set() and self._events.empty()

    def outcome(self) -> LessonOutcome:
        """The run's outcome, once it has ended; its error (one sentence) raised again here."""
        self._ended.wait()
        if self._error is not None:
            raise self._error
        assert self._outcome is not None
        return self._outcome
