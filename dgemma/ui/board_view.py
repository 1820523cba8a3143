"""The live view as one component: compact frames in (dgemma/ui/compact.py), drawn by the browser
(assets/board_view.js): the overview of the batch, a focus card, the cards. Its template
(assets/board_view.html) never changes, so Gradio never redraws it; a finished card's Refine is the
component's own `refine` event.
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

# The overview first, level with the charts beside the view; its legend under it; `{action}`: the button to press.
TEMPLATE = asset("board_view.html")


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
