"""The pace of a replay: which step is due now, and whether the charts are due a redraw.

A timer tick that advanced one step per tick fell behind whenever a tick came late (a slow link,
a busy browser): at 0.25 s a step, a 32 x 256 replay of 3 steps took 1.3 s against 0.75 s due.
`PlayClock` reads the step from the wall clock instead, so a late tick shows the step due now
(skipping the ones missed) and the replay ends on time. The charts (a Plotly redraw costs the
browser far more than a frame of the cards) are redrawn at most once a `chart_period` while
playing, and always at the last step, as the live stream does.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field


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

    def charts_due(self, period: float, last: bool) -> bool:
        """Whether this tick redraws the charts (and, if so, note that it did)."""
        now = self.clock()
        if last or now - self.charts_at >= period:
            self.charts_at = now
            return True
        return False
