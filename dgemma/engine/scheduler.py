"""Who runs: the waiting FIFO, slots, admission (capped after a preemption) and the preemption victim.

Plain Python, no torch: the scheduler only decides; `EngineCore` frees memory and emits events.
vLLM's recompute preemption and `max_num_seqs` (docs/design.md, "The engine").
"""

from __future__ import annotations

import itertools
from collections import deque

from dgemma.events import Status
from dgemma.engine.requests import Request


class Scheduler:
    """Slots for `max_num_seqs` requests and the queue in front of them."""

    def __init__(self, max_num_seqs: int):
        self.max_num_seqs = max_num_seqs
        self.waiting: deque[Request] = deque()  # FIFO; a preempted request goes back to the front
        self.running: dict[int, Request] = {}  # slot -> request
        self._free_slots = list(range(max_num_seqs))
        self._admissions = itertools.count(1)
        # After a preemption: how many requests may run at once (what fit then, plus one per request
        # that ended since), so memory does not refill at once and preempt again. None = no cap.
        self.admit_cap: int | None = None

    def rows(self) -> list[Request]:
        """The running requests in slot order (the decoder batch's row order)."""
        return [req for _, req in sorted(self.running.items())]

    def is_running(self, req: Request) -> bool:  # asked only while scheduling (tests/test_structure.py)
        return req.slot is not None and self.running.get(req.slot) is req

    def admit(self) -> list[Request]:
        """Move waiting requests into free slots, FIFO, up to the cap; returns them."""
        admitted = []
        while self.waiting and self._free_slots and (self.admit_cap is None or len(self.running) < self.admit_cap):
            req = self.waiting.popleft()
            req.slot = self._free_slots.pop(0)
            req.admitted = next(self._admissions)
            req.status = Status.RUNNING
            self.running[req.slot] = req
            admitted.append(req)
        return admitted

    def remove_waiting(self, ids: set[int]) -> list[Request]:
        """Take the waiting requests with these ids out of the queue."""
        taken = [r for r in self.waiting if r.id in ids]
        self.waiting = deque(r for r in self.waiting if r.id not in ids)
        return taken

    def release(self, req: Request, ended: bool) -> bool:
        """Free `req`'s slot; True if it held one. `ended`: it finished, so the cap may grow by one."""
        held = req.slot is not None  # a running request's; a slot is taken back here or by clear_running
        if held:
            del self.running[req.slot]
            self._free_slots.append(req.slot)
            self._free_slots.sort()
            if ended and self.admit_cap is not None:
                self.admit_cap += 1  # memory came back: admit one more (lifted at max_num_seqs)
                if self.admit_cap >= self.max_num_seqs:
                    self.admit_cap = None
        req.slot = None
        return held

    def victim(self) -> Request:
        """The request to preempt when memory runs out: the newest admitted."""
        return max(self.running.values(), key=lambda r: r.admitted)

    def requeue_first(self, req: Request) -> None:
        """A preempted request (slot already released) waits at the front; cap admission to what fits now."""
        self.waiting.appendleft(req)
        self.admit_cap = len(self.running)

    def clear_running(self) -> None:
        """Forget every running request (after a failure)."""
        for req in self.running.values():
            req.slot = None
        self.running.clear()
        self._free_slots = list(range(self.max_num_seqs))
        self.admit_cap = None
