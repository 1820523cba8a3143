"""What all tabs' recordings and kept boards hold in memory, under one cap: each holder (a tab's
Playback, a side of its comparison, an API call's recording) is counted under its key (`runs.keep_key`); past the cap
the least recently used idle holder is evicted (told one sentence) and a live one never."""

from __future__ import annotations

import threading
import time
from typing import Protocol


EVICTED = ("This tab's run was removed from the server's memory to make room for other visitors' runs; "
           "press Run again, or load its downloaded file.")


DEFAULT_MAX_BYTES = 2**30  # about a dozen runs at the recording's bound (80 MB each), thousands of small ones


class Holder(Protocol):
    live: bool  # still recording: never evicted
    last_used: float  # time.monotonic() of the last view of its run: the least recent goes first

    def held_bytes(self) -> int: ...

    def evict(self, sentence: str) -> None:
        """Drop the recording and board; say `sentence` when next used ("" for a closed tab)."""


class HeldRuns:
    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self.evicted = 0  # holders evicted so far
        self._held: dict[str, tuple[Holder | None, int]] = {}  # key -> (holder or a reservation, its bytes)
        self._total = 0  # the sum of those bytes
        self._lock = threading.Lock()

    @property
    def total(self) -> int:
        with self._lock:
            return self._total

    def __len__(self) -> int:  # the keys held
        with self._lock:
            return len(self._held)

    def hold(self, key: str, holder: Holder) -> None:
        """Count what `holder` holds now under `key`; evict the least recently used idle holders of
        other keys while the total passes the cap."""
        holder.last_used = time.monotonic()  # held now: a run just made or loaded is in use
        self._hold(key, holder, holder.held_bytes())

    def admit(self, key: str, most: int) -> bool:
        """Reserve `most` bytes under `key` (an API call's recording, live until released), unless the total
        would still pass the cap with every idle holder evicted: then nothing is held or evicted, and False."""
        return self._hold(key, None, most, refuse=True)

    def _hold(self, key: str, holder: Holder | None, size: int, refuse: bool = False) -> bool:
        with self._lock:
            if refuse and sum(n for k, (h, n) in self._held.items() if _live(h) and k != key) + size > self.max_bytes:
                return False
            self._total += size - self._held.get(key, (None, 0))[1]
            self._held[key] = (holder, size)
            victims = self._over_cap(key) if self._total > self.max_bytes else []
        for victim in victims:  # outside the lock: a holder's evict takes its own
            victim.evict(EVICTED)
        return True

    def release(self, key: str) -> int:
        """Free what `key` holds and forget it (its tab closed: Gradio keeps a closed tab's state
        for an hour, so the holder drops its recording now); the bytes it held."""
        with self._lock:
            holder, size = self._held.pop(key, (None, 0))
            self._total -= size
        if holder is not None:  # (a reservation has none: its call keeps its recording until it returns)
            holder.evict("")
        return size

    def _over_cap(self, keep: str) -> list[Holder]:
        idle = sorted((holder.last_used, key) for key, (holder, _) in self._held.items()
                      if key != keep and not _live(holder))
        victims = []
        for _, key in idle:
            if self._total <= self.max_bytes:
                break
            holder, size = self._held.pop(key)
            self._total -= size
            victims.append(holder)
        self.evicted += len(victims)
        return victims


def _live(holder: Holder | None) -> bool:
    return holder is None or holder.live  # a reservation (None) lives until released
