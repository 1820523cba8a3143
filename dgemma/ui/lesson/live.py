"""The lesson's runs, live: the same overview of the batch as the Generate tab's (dgemma/ui/board_view.py),
fed the same compact frames (dgemma/ui/compact.py) by the same run stream as a Generate run's
(`RunService.stream`, dgemma/serving/runs.py).

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
from dgemma.serving.runs import RunService
from dgemma.settings import Settings
from dgemma.ui import board_view
from dgemma.ui.board import Board, fail_unfinished, fold
from dgemma.ui.compact import frame
from dgemma.ui.lesson.outcomes import LessonOutcome, summarize

IDLE = '<div class="lesson-board-title">Press <b>Run</b>: each run\'s canvases denoise here, one row per request.</div>'


def build() -> tuple[gr.HTML, gr.HTML]:
    """Which run the view shows, and the view (call inside the lesson's tab)."""
    title = gr.HTML(IDLE, elem_id="lesson-board-title")
    return title, board_view.build(elem_id="lesson-board")


def title(run: str, requests: int) -> str:
    """The line over the view: the run it shows."""
    return (f'<div class="lesson-board-title"><b>{html.escape(run)}</b>, live: {requests} requests, one row each, '
            "one cell per canvas position.</div>")


def watch(service: RunService, request: object, prompts: list[str], settings: Settings,
          where: str) -> Generator[dict, None, LessonOutcome]:
    """One run of `prompts` under `settings` for the request's tab: its board as compact frames while
    it runs (as its page can take them, the last when it has ended); returns its outcome, read from
    every event the run sent. A run that cannot start or whose stream fails raises ValueError with
    one sentence."""
    recording = Recording()  # every event, for the outcome and the step-through
    board, shown = Board(), -1
    started = time.monotonic()
    ticks = service.stream(request, prompts, settings)
    try:
        for tick in ticks:
            recording.extend(tick.events)
            fold(tick.events, board)
            if tick.failure:  # every card it stopped says so, then the tab's card of this run
                if board.requests:
                    yield tick.stamp(frame(fail_unfinished(board, tick.failure), board.canvas_length, refine=False))
                raise ValueError(tick.failure)
            # A tick the page cannot take yet, an unchanged board (the keep-alive, where Gradio notices
            # a closed page) and one with no canvas yet (queued) send nothing: the last run's board stays
            # until this run's first step arrives, or until it has ended without one.
            if (not tick.send or board.events == shown or not board.requests
                    or not (board.canvas_length or board.finished)):
                yield gr.skip()
                continue
            shown = board.events
            # No Refine on the lesson's cards (a Generate run's); nor its data, the heaviest part of a last frame.
            yield tick.stamp(frame(board, board.canvas_length, refine=False))
    finally:
        ticks.close()  # its end frees the run's requests now, not when collected
    return summarize(recording.events(), time.monotonic() - started, where)
