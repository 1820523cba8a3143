"""Canvas cards: one HTML card per request, drawn from the board (pure: board in, HTML out).

The page now draws compact frames (compact.py, assets/board_view.js) in every view; these HTML
cards are what it drew before, the baseline `python -m dgemma.bench frames` sets the frames
against, and this module's helpers (a piece as a cell shows it, what Refine starts from) are theirs.

A card shows, top to bottom: who it is (request, seed, status), a note when the served model was
not trained for its prompt, the committed text (canvases that converged and were appended to the
cache), and the live canvas being denoised. Each live
token is shaded by its confidence, exp(-entropy): dark = the model is sure of this position.
Accepted positions (kept the sampled token) are green; re-noised ones (replaced by uniform
random tokens for the next step) are grey and dashed. Colours come from CSS variables set in
assets/style.css, so the HTML carries one number per token, not a style sheet.

Tokens of a real checkpoint are word pieces, not characters: SentencePiece's '▁' shows as the
space it stands for, special tokens are marked (a symbol in a cell with `data-special`), pieces
longer than MAX_CELL characters are clipped with the full text on hover, and every committed
token shows its log-probability on hover.
"""

from __future__ import annotations

import html
import math

from dgemma.events import StepEvent
from dgemma.ui.board import Board, RequestView

# Whitespace pieces would be invisible on a canvas; show them as visible marks instead.
_VISIBLE = str.maketrans({"\n": "↵", "\t": "⇥", "\r": "␍"})


def confidence(entropy: float) -> float:
    """exp(-entropy) in [0, 1]: 1 for a certain position, near 0 for a flat distribution."""
    if not math.isfinite(entropy) or entropy < 0:
        return 0.0
    return math.exp(-entropy)


def status_text(view: RequestView) -> str:
    """queued / step k of max / converged / done / cancelled / error: why."""
    step = view.last_step
    if view.status == "error":
        return f"error: {view.error}" if view.error else "error"
    if view.status == "queued" and view.preemptions:
        return "queued again: preempted to free memory"
    if view.status in ("queued", "done", "cancelled"):
        return view.status
    if view.status == "converged" and step is not None:
        return f"converged at step {step.step}"
    if step is not None and step.step == 0:
        return f"random start (step 0 of {step.max_steps})"
    if step is not None:
        return f"step {step.step} of {step.max_steps}"
    return "running"


# Special tokens would take five cells each on a canvas of characters: one symbol instead.
_SPECIAL = {"<pad>": "▫", "<eos>": "■", "<bos>": "▸", "<unk>": "?"}
MAX_CELL = 12  # characters a canvas cell shows; a longer piece is clipped, in full on hover


def is_special(text: str) -> bool:
    return text in _SPECIAL or (len(text) > 2 and text.startswith("<") and text.endswith(">"))


def shown_piece(text: str) -> str:
    """What a canvas cell shows of a piece (plain text, not yet escaped for HTML)."""
    # A space keeps its cell (white-space: pre) and its shading, as does SentencePiece's '▁' (a
    # space in the text); line breaks and tabs become visible marks, an empty piece a dot.
    if is_special(text):
        return _SPECIAL.get(text, "◆")
    shown = text.replace("▁", " ").translate(_VISIBLE) or "∅"
    if len(shown) > MAX_CELL:
        shown = shown[: MAX_CELL - 1] + "…"
    return shown


def _piece(text: str) -> str:
    return html.escape(shown_piece(text))


def render_canvas(step: StepEvent) -> str:
    """The live canvas: one <span> per position, confidence as a CSS variable."""
    parts = []
    for piece, entropy, accepted in zip(step.pieces, step.entropy, step.accepted, strict=False):
        cls = "tok acc" if accepted else "tok noise"
        mark = " data-special" if is_special(piece) else ""  # an attribute: the classes stay two
        parts.append(
            f'<span class="{cls}"{mark} style="--c:{confidence(entropy):.2f}" '
            f'title="{html.escape(repr(piece))} · entropy {entropy:.3g}">{_piece(piece)}</span>'
        )
    return "".join(parts)


def render_committed(view: RequestView, pinnable: int = 0) -> str:
    """The committed text, one <span> per token with its log-probability on hover.

    Falls back to the plain text when the pieces seen do not spell it (a reader that joined
    late, or a tokenizer whose single-token decodes differ from its text, e.g. byte pieces).
    """
    pieces = [p.replace("▁", " ") for p in view.committed_pieces]
    shown = [(i, p) for i, p in enumerate(pieces) if not is_special(view.committed_pieces[i])]
    if not pieces or "".join(p for _, p in shown) != view.committed_text:
        return html.escape(view.committed_text)
    logprobs = view.committed_logprobs if len(view.committed_logprobs) == len(pieces) else []
    spans = []
    for i, piece in shown:
        hover = repr(piece)
        if logprobs:
            hover += f" · logprob {logprobs[i]:.3f} (p {math.exp(logprobs[i]):.2f})"
        # The first canvas's tokens can be pinned: a click writes "position=piece" into the pins box.
        pin = f' data-pos="{i}" data-piece="{html.escape(view.committed_pieces[i])}"' if i < pinnable else ""
        if pin:
            hover += " · click to pin"
        spans.append(f'<span class="ctok"{pin} title="{html.escape(hover)}">{html.escape(piece)}</span>')
    return "".join(spans)


def refine_button(view: RequestView, canvas_length: int) -> str:
    """A finished card's Refine: run its prompt and seed again, the first canvas starting from its
    text (the attributes the page's script read when it drew these cards)."""
    if not refinable(view):
        return ""
    return (f'<button class="refine" title="run it again, its first canvas starting from this text" '
            f'data-prompt="{html.escape(view.prompt)}" data-seed="{view.seed}" '
            f'data-start="{html.escape(refine_start(view, canvas_length))}">Refine</button>')


def refinable(view: RequestView) -> bool:
    """A finished request with text and a seed can be run again from its text."""
    return view.status == "done" and bool(view.committed_text) and view.seed is not None


def refine_start(view: RequestView, canvas_length: int) -> str:
    """What Refine starts the first canvas from: the text of the request's first canvas."""
    start = "".join(p.replace("▁", " ") for p in view.committed_pieces[:canvas_length] if not is_special(p))
    return start or view.committed_text


def render_card(view: RequestView, note: str = "", canvas_length: int = 0) -> str:
    step = view.last_step
    seed = f" · seed {view.seed}" if view.seed is not None else ""
    prompt = html.escape(view.prompt[:80] + ("…" if len(view.prompt) > 80 else ""))
    if view.committed_text:
        committed = render_committed(view, canvas_length if view.status == "done" else 0)
    elif view.status == "done":
        committed = '<span class="empty">empty: the model ended the text at once</span>'
    else:
        committed = '<span class="empty">nothing committed yet</span>'
    if step is not None:
        accepted = sum(step.accepted)
        live = render_canvas(step)
        meter = (
            f'<div class="meter">canvas {step.canvas_index + 1} · accepted {accepted}/{len(step.accepted)}'
            f" · mean entropy {step.mean_entropy:.3g} (confident below {step.confidence_threshold:g})</div>"
        )
    else:
        live, meter = "", ""
    return (
        f'<div class="card status-{html.escape(view.status)}" data-request="{view.request_id}" '
        f'data-step="{step.step if step else 0}">'
        f'<div class="card-head"><b title="engine request {view.request_id}">#{view.index}</b>{seed}'
        f'<span class="status">{html.escape(status_text(view))}</span>{refine_button(view, canvas_length)}</div>'
        f'<div class="prompt" title="prompt">{prompt}</div>'
        + (f'<div class="note" role="note">{html.escape(note)}</div>' if note else "")
        + f'<div class="committed">{committed}</div>'
        f'<div class="canvas">{live}</div>{meter}</div>'
    )


LEGEND = (
    '<div class="legend"><span class="tok acc" style="--c:0.9">sure</span>'
    '<span class="tok acc" style="--c:0.3">unsure</span> accepted · '
    '<span class="tok noise" style="--c:0.5">re-noised</span> replaced by random tokens next step · '
    "darker = lower entropy (confidence = e<sup>−entropy</sup>) · "
    "grey box above the canvas = committed text (hover a token for its log-probability) · "
    "■ end of text, ▫ padding, ◆ other special tokens · long pieces are clipped (hover for all)</div>"
)


def render_board(board: Board) -> str:
    """All cards of a session, in submission order, with the legend; a hint when empty."""
    if not board.requests:
        return '<div class="board empty-board">Press <b>Run</b> to watch the canvases denoise.</div>'
    cards = "".join(render_card(v, board.notes.get(v.index, ""), board.canvas_length) for v in board.requests.values())
    return f'{LEGEND}<div class="board">{cards}</div>'
