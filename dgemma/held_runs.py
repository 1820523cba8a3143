"""What all sessions' recordings and kept boards hold in memory, under one cap.

Every tab keeps its last run (a `Recording`, up to 80 MB at its bound) and the board it last showed;
an API call with `record: true` holds one while it runs. A public app cannot let visitors add these
up without end, so each holder is registered here under its session with what it holds:

- `hold(session, holder)` counts (or recounts) what the holder holds and makes it the session's
  newest use; `use(session)` marks a view of it (the slider, play);
- when the total passes the cap, the least recently used idle holder goes first: its `evict(sentence)`
  drops its recording and board, and its page says the sentence when next used; a live holder (a
  run still recording) is never evicted, nor the one being held now;
- `release(session)` forgets a session whose tab closed (after it dropped what it held).
"""

from __future__ import annotations

import threading
import time
from typing import Protocol

EVICTED = ("This tab's run was removed from the server's memory to make room for other visitors' runs; "
           "press Run again, or load its downloaded file.")


class Holder(Protocol):
    live: bool  # still recording: never evicted

    def held_bytes(self) -> int: ...

    def evict(self, sentence: str) -> None:
        """Drop the recording and board; say `sentence` when next used ("" for a closed tab)."""


class HeldRuns:
    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self.evicted = 0  # holders evicted so far
        self._held: dict[str, tuple[Holder, int, float]] = {}  # session -> (holder, bytes, last use)
        self._lock = threading.Lock()

    @property
    def total(self) -> int:
        with self._lock:
            return sum(size for _, size, _ in self._held.values())

    def sessions(self) -> int:
        with self._lock:
            return len(self._held)

    def hold(self, session: str, holder: Holder) -> list[str]:
        """Count what `holder` holds now for `session` (its newest use); evict the least recently used
        idle holders of other sessions while the total passes the cap. The sessions evicted."""
        size = holder.held_bytes()
        with self._lock:
            self._held[session] = (holder, size, time.monotonic())
            victims = self._over_cap(session)
        for _, victim in victims:  # outside the lock: a holder's evict takes its own
            victim.evict(EVICTED)
        return [s for s, _ in victims]

    def use(self, session: str) -> None:
        """The session's run was viewed: it is the most recently used."""
        with self._lock:
            if session in self._held:
                holder, size, _ = self._held[session]
                self._held[session] = (holder, size, time.monotonic())

    def release(self, session: str) -> int:
        """Free what `session` holds and forget it (its tab closed: Gradio keeps a closed tab's state
        for an hour, so the holder drops its recording now); the bytes it held."""
        with self._lock:
            holder, size, _ = self._held.pop(session, (None, 0, 0.0))
        if holder is not None:
            holder.evict("")
        return size

    def _over_cap(self, keep: str) -> list[tuple[str, Holder]]:
        total = sum(size for _, size, _ in self._held.values())
        idle = sorted((used, session) for session, (holder, _, used) in self._held.items()
                      if session != keep and not holder.live)
        victims = []
        for _, session in idle:
            if total <= self.max_bytes:
                break
            holder, size, _ = self._held.pop(session)
            total -= size
            victims.append((session, holder))
        self.evicted += len(victims)
        return victims
