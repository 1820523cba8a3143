"""From an event stream to a few frames a second: fold every event, render only on a tick.

A step of 32 requests emits 32 StepEvents and a TilePlan; re-rendering the page per event would
spend the CPU the engine needs and flood the browser. `frames` folds events into the board as
fast as they come and hands the board out at most `hz` times a second (and once more at the end),
so the page stays live (>= 4 updates/s) whatever the step rate. While nothing changes (requests
waiting in the queue) it still hands the board out every `keepalive` seconds: each yield is where
Gradio notices that the client has gone and closes the stream, so a silent run is closed too.

`run_boards` is one started run's boards as the live run and Compare draw them, through
`coalesced`: a run that fails (say ZeroGPU refuses the call) ends with one sentence on its board,
never a traceback, and the run's requests are freed however its stream ends.

`coalesced` is how every stream of the page (a live run, Compare's runs, a replay) reaches its
visitor: an update that comes while the visitor's earlier messages are still unwritten (a link
slower than the stream; dgemma/serving/backlog.py) is skipped, never queued, and the next one
carries the state of its moment, since Gradio sends each yield as a diff against the one yielded
before it. The last update always goes. A page that says which frames it has drawn
(dgemma/serving/acks.py; the caller stamps each frame it sends with `Visitor.stamp`) is behind
until it has drawn the last one: at most one frame is then in flight to it, whatever the link's
buffers would take in.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

import gradio as gr

from dgemma.errors import first_line
from dgemma.events import Event
from dgemma.serving.backlog import Visitor
from dgemma.serving.sessions import Sessions, client_left
from dgemma.ui.board import FINAL, Board, apply, fail_unfinished

T = TypeVar("T")
log = logging.getLogger(__name__)


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


def coalesced(updates: Iterable[T], visitor: Visitor, last: Callable[[T], bool], still_there_s: float = 5.0,
              clock: Callable[[], float] = time.monotonic) -> Iterator[T]:
    """`updates` as `visitor` can take them: those that come while they are behind are skipped,
    except the `last` one, and one every `still_there_s` seconds: a yield is where Gradio notices
    a client that has gone (whose unwritten messages stay in its queue), and a link that moves at
    all takes a frame in less. Pass cheap states (a board, a step) and draw what comes out: a
    skipped update then costs nothing to draw either. A visitor whose client has gone gets the next
    update at once (Gradio ends the stream there, freeing its requests). A visitor who fell behind
    gets one log line.
    The visitor is closed when the stream ends."""
    skipped = sent = 0
    sent_at = clock()
    try:
        for update in updates:
            if last(update) or not visitor.behind() or visitor.gone() or clock() - sent_at >= still_there_s:
                sent, sent_at = sent + 1, clock()
                yield update
            else:
                skipped += 1
    finally:
        visitor.close()
        if skipped or visitor.most_waiting > 1:
            log.info("a visitor behind: %d updates skipped, %d sent, at most %d messages waiting for them",
                     skipped, sent, visitor.most_waiting)


def run_boards(handle, sessions: Sessions, session: str, board: Board, visitor: Visitor | None = None) -> Iterator[Board]:
    """The boards of `handle`'s run (started, and added to `session`'s requests) as its visitor can
    take them (`visitor`: pass one to stamp the frames drawn from them); the last one is finished, or
    failed: then `board.failure` says why in one sentence and every card it stopped says so. Its
    requests end with the stream, whatever ends it."""
    try:
        boards = frames(handle.poll, lambda b: b.finished and len(b.requests) >= handle.size, board)
        yield from coalesced(boards, visitor or Visitor(session), lambda b: b.finished)  # one board, folded on: `board` is it
    except Exception as err:  # e.g. ZeroGPU refused the call (quota, queue, duration)
        if not isinstance(err, gr.Error):
            log.exception("a run's stream failed")
        yield fail_unfinished(board, err.message if isinstance(err, gr.Error) else f"The run failed: {first_line(err)}")
    except GeneratorExit:  # Gradio closed the stream: its client has gone (tab closed, process died)
        client_left(handle.size - sum(v.status in FINAL for v in board.requests.values()), "stream closed")
        raise
    finally:
        handle.close()  # a closed page: free the slots; a no-op for requests already done
        sessions.remove(session, handle)
