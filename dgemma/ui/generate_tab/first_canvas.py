"""The Generate tab's first-canvas inputs: start from text (edit), pin tokens (infill), and Refine.

Start from: text whose tokens fill the first canvas from position 0; the rest starts random. Pins:
`position=token` lines held for the whole denoising (a click on a finished card's token adds one).
Template: cells split by `|`, `_` or nothing free (`4|_|_|1` pins positions 0 and 3). Refine: the
card's `refine` event names its row, and its prompt, seed and first canvas's text are read off the
run of the view it is in (a real-scale frame has no room to carry them). Whether a piece is one
token is the server's to say: one sentence on the status line."""

from __future__ import annotations

from typing import Any

import gradio as gr

from dgemma.errors import SettingsError
from dgemma.recording import Recording
from dgemma.settings import BY_NAME, name_value_pairs
from dgemma.ui import asset
from dgemma.ui.board import RequestView
from dgemma.ui.compact import is_special, refinable
from dgemma.ui.seek import Seeker

REFINE_NEEDS_A_CARD = "Refine needs a finished card of this tab's run: press Refine on one."

CARD_CLICKS_JS = asset("card_clicks.js")  # pins a clicked token, refines a card


def build() -> dict[str, gr.Textbox]:
    """The first canvas's inputs by name: the table's `start` and `pins`, and the page's template."""
    start, pins = BY_NAME["start"], BY_NAME["pins"]
    with gr.Accordion("First canvas: start from text (edit), pin tokens (infill)", open=False, elem_id="first-canvas"):
        with gr.Row():
            fields = {
                "start": gr.Textbox(label=start.label, elem_id="start", scale=2, placeholder="e.g. 12 13",
                                    info=start.help),
                "pins": gr.Textbox(label=pins.label, elem_id="pins", lines=2, scale=2, placeholder="0=4",
                                   info=f"{pins.help}; click a finished card's token to add it"),
                "template": gr.Textbox(label="Template", elem_id="template", scale=2, placeholder="4|_|_|1",
                                       info="pins as one cell per position, split by |; an empty cell or an "
                                            "underscore leaves it free"),
            }  # fmt: skip
    return fields


def canvas_settings(start: str | None, pins: str | None, template: str | None) -> dict[str, Any]:
    """The first-canvas inputs as the settings `start` and `pins`: the template's cells by | (`4|_|_|1` ->
    {"0": "4", "3": "1"}: `_` or nothing free), then the `position=token` lines (the token as written,
    spaces kept), a pin line winning over the template."""
    cells = enumerate(template.split("|")) if (template or "").strip() else ()
    held = {str(i): cell for i, cell in cells if cell not in ("", "_")}
    held.update(name_value_pairs((pins or "").splitlines(),
                                 "Pins: write one position=token per line (for example 3=x), got {part!r}."))
    return {"start": start or None, "pins": held or None}


def refine_request(card: object, recording: Recording | None, kept: Seeker, gone: str = "") -> tuple[str, dict]:
    """A Refine event's card (its data: {"request": row}) as (prompt, {seed, start text}), read off the run of
    the view it is in (`recording`, folded with its `kept` seeker): a finished request's first canvas never
    changes again, so the board at the run's last step has it. `gone`: why the view holds no run."""
    try:
        row = int(card["request"])  # type: ignore[index]
    except (ValueError, KeyError, TypeError):
        raise SettingsError(REFINE_NEEDS_A_CARD) from None
    if recording is None:
        raise SettingsError(gone or REFINE_NEEDS_A_CARD)
    with kept.at(recording, recording.steps) as board:
        view = next((v for v in board.requests.values() if v.index == row), None)
        if view is None or not refinable(view):
            raise SettingsError(REFINE_NEEDS_A_CARD)
        length = int(recording.header.get("model", {}).get("canvas_length") or 0)
        return view.prompt, {"seed": int(view.seed), "start": refine_start(view, length)}


def refine_start(view: RequestView, canvas_length: int) -> str:
    """What Refine starts the first canvas from: the text of the request's first canvas."""
    start = "".join(p.replace("▁", " ") for p in view.committed_pieces[:canvas_length] if not is_special(p))
    return start or view.committed_text
