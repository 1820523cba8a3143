"""The lesson's runs, live: the same overview of the batch as the Generate tab's (dgemma/ui/board_view.py),
fed the same compact frames (dgemma/ui/compact.py) a few times a second (dgemma/serving/runs.py `ticks`).

The backend tells each run as events (dgemma/serving/lesson_events.py); `watch` folds them into a
board and hands out one frame at a time while the run goes on its thread
(dgemma/serving/lesson_live.py), then returns the run's outcome. A run that runs out of memory
ends with every open card saying so.
"""

from __future__ import annotations

import html
from collections.abc import Generator

import gradio as gr

from dgemma.serving.backend import LessonOutcome
from dgemma.serving.lesson_live import LiveLesson
from dgemma.ui import board_view
from dgemma.serving.runs import ticks
from dgemma.ui.board import Board, fold
from dgemma.ui.compact import frame

IDLE = '<div class="lesson-board-title">Press <b>Run</b>: each run\'s canvases denoise here, one row per request.</div>'


def build() -> tuple[gr.HTML, gr.HTML]:
    """Which run the view shows, and the view (call inside the lesson's tab)."""
    title = gr.HTML(IDLE, elem_id="lesson-board-title")
    return title, board_view.build(elem_id="lesson-board")


def title(run: str, requests: int) -> str:
    """The line over the view: the run it shows."""
    return (f'<div class="lesson-board-title"><b>{html.escape(run)}</b>, live: {requests} requests, one row each, '
            "one cell per canvas position.</div>")


def watch(lesson: LiveLesson) -> Generator[dict, None, LessonOutcome]:
    """The run's board as compact frames while it runs (at most 6 a second, the last when it has
    ended); returns its outcome (its error raised again: one sentence)."""
    board, shown = Board(), -1
    for tick in ticks(lesson.poll, lesson.finished):
        fold(tick.events, board)
        # An unchanged board (frames' keep-alive, where Gradio notices a closed page) sends nothing, and
        # nor does an empty one: the last run's board stays until this run's first step arrives.
        if board.events == shown or not board.requests:
            yield gr.skip()
            continue
        shown = board.events
        # No Refine on the lesson's cards (a Generate run's); nor its data, the heaviest part of a last frame.
        yield frame(board, board.canvas_length, refine=False)
    return lesson.outcome()
