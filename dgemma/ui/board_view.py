"""The live view as one component: compact frames in (dgemma/ui/compact.py), drawn by the browser
(assets/board_view.js): the overview of the batch, a focus card, the cards. Its template never
changes, so Gradio never redraws it; a finished card's Refine is the component's own `refine` event.
`frames` is the one loop from a run's ticks to the frames its views send (Run, Compare, the lesson)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator

import gradio as gr

from dgemma.serving.runs import Tick
from dgemma.ui import asset
from dgemma.ui.board import Board, fail_unfinished, fold
from dgemma.ui.compact import SCHEMA, frame

# The frames' constants, from the module that makes them, ahead of the script that reads them.
SCRIPT = f"const SCHEMA = {json.dumps(SCHEMA)};\n" + asset("board_view.js")

LEGEND = (
    '<div class="legend"><b>Overview</b>: one row per request, one cell per canvas position: '
    '<span class="swatch acc">accepted</span> <span class="swatch noise">re-noised</span> '
    '<span class="swatch committed">committed</span>, darker = surer (confidence = e<sup>−entropy</sup>; '
    "a committed token's probability). Hover a cell for its token, or focus the overview (Tab) and move "
    "with the arrow keys; click a row or press Enter to see that request in full below.<br>"
    '<b>Cards</b>: <span class="tok acc" style="--c:0.9">sure</span>'
    '<span class="tok acc" style="--c:0.3">unsure</span> accepted · '
    '<span class="tok noise" style="--c:0.5">re-noised</span> replaced by random tokens next step · '
    "grey box = committed text (its end, when long) · ■ end of text, ▫ padding, ◆ other special tokens · "
    "long pieces are clipped (hover for all)</div>"
)
# The overview first, level with the charts beside the view; its legend under it.
TEMPLATE = (
    '<div class="dgv">'
    '<div class="dgv-overview"><canvas tabindex="0" role="img" '
    'aria-label="Overview of every request\'s canvas: arrow keys move, Enter shows a request in full"></canvas>'
    f'<div class="dgv-tip" role="status" aria-live="polite" hidden></div></div>{LEGEND}'
    '<div class="dgv-focus"></div><div class="board dgv-cards"><div class="empty-board">Press <b>{action}</b> to watch '
    'the canvases denoise.</div></div></div>'
)


def build(elem_id: str = "cards", clicks_js: str = "", action: str = "Run") -> gr.HTML:
    """The view, empty until the first frame, saying which button to press (`action`) (call inside a Blocks);
    `clicks_js`: a script that listens on the view's element for clicks on what the cards draw
    (first_canvas.CARD_CLICKS_JS, which triggers `refine`)."""
    return gr.HTML(frame(Board()), html_template=TEMPLATE.format(action=action), js_on_load=SCRIPT + "\n" + clicks_js,
                   apply_default_css=False, elem_id=elem_id)


def frames(ticks: Iterator[Tick], board: Board, refine: bool = True,
           draw: Callable[[Board], bool] = lambda board: True) -> Iterator[tuple[Tick, dict | None]]:
    """A run's ticks (`RunService.stream`) folded into `board`, each with the frame to send now, stamped
    for its page to acknowledge: None when the visitor has not drawn the last one, the board has not
    changed, or `draw(board)` says the view does not want it (a frame made is a frame sent). A failure
    first fails every open card; its frame goes when there are cards. `ticks` closes with this loop,
    whatever ends it: the run's requests are freed then, not when collected."""
    sent = -1
    try:
        for tick in ticks:
            fold(tick.events, board)
            if tick.failure and board.requests:
                fail_unfinished(board, tick.failure)
            due = (bool(board.requests) if tick.failure
                   else tick.send and (board.events != sent or tick.finished) and draw(board))
            if due:
                sent = board.events
            yield tick, tick.stamp(frame(board, refine=refine)) if due else None
    finally:
        ticks.close()
