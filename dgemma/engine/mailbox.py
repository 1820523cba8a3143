"""A thread-safe event mailbox that never blocks the producer and never loses a final result.

The engine thread `put`s events; a consumer thread (a page's stream, the CLI, a test) `poll`s
them. A slow consumer must not slow the engine and must not make memory grow without bound,
so intermediate frames coalesce:

- consecutive `StepEvent`s of one request with nothing of that request between them collapse
  into the latest (a consumer that falls behind sees fewer frames, never stale ones);
- `TilePlan`s beyond `max_plans` unread drop the oldest (the live plot loses old points);
- `RequestEvent`s (queued, running, committed, done, cancelled, error) are never dropped and
  keep their order relative to the request's step frames.
"""

from __future__ import annotations

import threading
import time
from collections import deque

from dgemma.events import Event, RequestEvent, StepEvent, TilePlan


class _Slot:
    """A place in the queue whose step frame may be overwritten until it is read or sealed."""

    __slots__ = ("event",)

    def __init__(self, event: StepEvent):
        self.event = event


class Mailbox:
    def __init__(self, max_plans: int = 1024, coalesce: bool = True):
        self._cond = threading.Condition()
        self._queue: deque[Event | _Slot] = deque()
        self._open_step: dict[int, _Slot] = {}  # request id -> its unread, still-mergeable frame
        self._plans = 0
        self._max_plans = max_plans
        self._coalesce = coalesce  # False: every frame kept (tests, offline consumers; unbounded)
        self._closed = False

    def put(self, event: Event) -> None:
        with self._cond:
            if self._closed:
                return
            if isinstance(event, StepEvent):
                slot = self._open_step.get(event.request_id) if self._coalesce else None
                if slot is not None:
                    slot.event = event  # the reader has not seen the previous frame: replace it
                    return
                slot = self._open_step[event.request_id] = _Slot(event)
                self._queue.append(slot)
            else:
                if isinstance(event, RequestEvent):
                    self._open_step.pop(event.request_id, None)  # later frames go after this event
                elif isinstance(event, TilePlan):
                    self._plans += 1
                    if self._coalesce and self._plans > self._max_plans:
                        self._drop_oldest_plan()
                self._queue.append(event)
            self._cond.notify_all()

    def _drop_oldest_plan(self) -> None:
        for i, item in enumerate(self._queue):
            if isinstance(item, TilePlan):
                del self._queue[i]
                self._plans -= 1
                return

    def poll(self, timeout: float | None = 0.0) -> list[Event]:
        """Every event waiting now; waits up to `timeout` seconds (None: forever) for the first."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while not self._queue and not self._closed:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return []
                self._cond.wait(remaining)
            items, self._queue = self._queue, deque()
            self._open_step.clear()
            self._plans = 0
        return [item.event if isinstance(item, _Slot) else item for item in items]

    def close(self) -> None:
        """Stop accepting events and wake any reader (it drains what is left, then gets [])."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    @property
    def closed(self) -> bool:
        return self._closed
