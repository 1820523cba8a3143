"""The lesson's runs, live: the same overview of the batch as the Generate tab's (dgemma/ui/board_view.py),
fed the same compact frames (dgemma/ui/compact.py) by the same stream as a Generate run's
(`run_boards`, dgemma/ui/stream.py).

Each run is an ordinary `Backend.start`; `watch` hands out its frames while it goes, then returns
its outcome, read from the run's recording (dgemma/ui/lesson/outcomes.py). A run that runs out of
memory ends with every open card saying so.
"""

from __future__ import annotations

import html
import time
from collections.abc import Generator

import gradio as gr

from dgemma.recording import Recording
from dgemma.serving.backend import Backend
from dgemma.serving.backlog import Visitor
from dgemma.serving.sessions import Sessions
from dgemma.settings import Settings
from dgemma.ui import board_view
from dgemma.ui.board import Board
from dgemma.ui.compact import frame
from dgemma.ui.lesson.outcomes import LessonOutcome, summarize
from dgemma.ui.stream import run_boards

IDLE = '<div class="lesson-board-title">Press <b>Run</b>: each run\'s canvases denoise here, one row per request.</div>'


def build() -> tuple[gr.HTML, gr.HTML]:
    """Which run the view shows, and the view (call inside the lesson's tab)."""
    title = gr.HTML(IDLE, elem_id="lesson-board-title")
    return title, board_view.build(elem_id="lesson-board")


def title(run: str, requests: int) -> str:
    """The line over the view: the run it shows."""
    return (f'<div class="lesson-board-title"><b>{html.escape(run)}</b>, live: {requests} requests, one row each, '
            "one cell per canvas position.</div>")


def watch(backend: Backend, sessions: Sessions, session: str, prompts: list[str], settings: Settings,
          where: str) -> Generator[dict, None, LessonOutcome]:
    """One run of `prompts` under `settings`: its board as compact frames while it runs (a few a
    second, the last when it has ended); returns its outcome. A run that cannot start or whose
    stream fails raises ValueError with one sentence."""
    handle = backend.start(prompts, settings)
    try:
        sessions.add(session, handle)  # the session's cap on waiting requests holds here too
    except ValueError:
        handle.close()
        raise
    handle.recording = Recording()  # every event, for the outcome and the step-through
    started = time.monotonic()
    board, shown = Board(), -1
    visitor = Visitor(session)  # each frame sent is stamped: a page that says it drew it gets the next
    boards = run_boards(handle, sessions, session, board, visitor)
    try:
        for board in boards:
            # An unchanged board (the keep-alive, where Gradio notices a closed page) sends nothing, and
            # nor does one with no canvas yet (queued): the last run's board stays until this run's
            # first step arrives, or until it has ended without one.
            if board.events == shown or not board.requests or not (board.canvas_length or board.finished):
                yield gr.skip()
                continue
            shown = board.events
            # No Refine on the lesson's cards (a Generate run's); nor its data, the heaviest part of a last frame.
            yield visitor.stamp(frame(board, board.canvas_length, refine=False))
    finally:
        boards.close()  # its end frees the run's requests now, not when collected
    if board.failure:
        raise ValueError(board.failure)
    return summarize(handle.recording.events(), time.monotonic() - started, where)
