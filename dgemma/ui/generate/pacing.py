"""The pace of a replay: which step is due now, and whether the charts are due a redraw. Play is one
stream from the server, not a browser timer asking for each step: a late tick would push every later
step back, while here a step shown late is followed by the one due by then and play ends on time."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

# A step is sent this long before it is due: about what a real-scale frame (40 KB) takes to cross a
# 4 Mbit/s link with 40 ms latency and be drawn, so that it is on screen when due, not after.
SEND_AHEAD_S = 0.1


@dataclass
class PlayClock:
    """Play started at `step` at time `started`, `pace` seconds a step."""

    step: int
    pace: float
    clock: Callable[[], float] = time.monotonic
    started: float = field(default=0.0)
    charts_at: float = field(default=0.0)  # when the charts were last drawn

    def __post_init__(self) -> None:
        self.started = self.charts_at = self.clock()  # play shows the charts of the step it starts from

    def next_step(self, shown: int, pace: float) -> int:
        """The step a tick shows after `shown`: at least the next one, or the one due nearest to now."""
        now = self.clock()
        if pace != self.pace:  # the pace changed while playing: count from here at the new pace
            self.step, self.pace, self.started = shown, pace, now
        # The step whose due time is nearest: the frame takes a moment to reach the page, so a
        # step half a tick away is better shown now than a tick late.
        due = self.step + int((now - self.started) / self.pace + 0.5)
        return max(shown + 1, due)

    def wait(self, shown: int, ahead: float = SEND_AHEAD_S) -> float:
        """Seconds until the step after `shown` is to be sent: `ahead` of its due time, at most
        half a step early (0 when that time has come)."""
        ahead = min(ahead, self.pace / 2)
        return max(0.0, self.started + (shown + 1 - self.step) * self.pace - ahead - self.clock())

    def charts_due(self, period: float, last: bool) -> bool:
        """Whether this tick redraws the charts (and, if so, note that it did)."""
        now = self.clock()
        if last or now - self.charts_at >= period:
            self.charts_at = now
            return True
        return False
