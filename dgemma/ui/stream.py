"""From an event stream to a few frames a second: fold every event, render only on a tick.

A step of 32 requests emits 32 StepEvents and a TilePlan; re-rendering the page per event would
spend the CPU the engine needs and flood the browser. `frames` folds events into the board as
fast as they come and hands the board out at most `hz` times a second (and once more at the end),
so the page stays live (>= 4 updates/s) whatever the step rate. While nothing changes (requests
waiting in the queue) it still hands the board out every `keepalive` seconds: each yield is where
Gradio notices that the client has gone and closes the stream, so a silent run is closed too.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from dgemma.events import Event
from dgemma.ui.board import Board, apply


def frames(
    poll: Callable[[float], list[Event]],
    finished: Callable[[Board], bool],
    board: Board | None = None,
    hz: float = 6.0,
    keepalive: float = 0.5,
    clock: Callable[[], float] = time.monotonic,
) -> Iterator[Board]:
    """Yield `board` whenever it changed, at most `hz` times a second, at least every `keepalive`
    seconds even unchanged (the reader compares `board.events`), then once when finished.

    poll(timeout) returns the events that arrived (possibly none) within `timeout` seconds.
    finished(board) says when the stream is over (every request done, cancelled or failed).
    """
    board = Board() if board is None else board
    period = 1.0 / hz
    shown = -1  # board.events at the last yield
    next_tick = last_yield = clock()
    while True:
        for event in poll(max(0.0, next_tick - clock())):
            apply(board, event)
        if finished(board):
            yield board
            return
        now = clock()
        if now >= next_tick:
            if board.events != shown or now - last_yield >= keepalive:
                shown, last_yield = board.events, now
                yield board
            # If rendering ran late, wait half a period anyway: the engine needs the CPU more.
            next_tick = max(next_tick + period, clock() + period / 2)
