"""The board as one compact frame that the browser draws (assets/board_view.js): a row a request, its
fields named. `cells` is one character per canvas position (its state and confidence in LEVELS steps,
see CELLS), `pieces` what each position shows joined by SEP into one string (so Gradio's streaming
diff resends a changed row whole and never turns 256 pieces into 256 edits), `step` the live canvas's
step (None for a committed canvas), then the card's head and a finished card's `refine` and `first`.
SCHEMA, the constants both sides read, is handed to the script by dgemma/ui/board_view.py. Pure."""

from __future__ import annotations

import functools
import math

from dgemma.ui.board import Board, RequestView

LEVELS = 16
# One character per (state, confidence level): no character JSON escapes, none is SEP.
CELLS = {"accepted": "ABCDEFGHIJKLMNOP", "noise": "abcdefghijklmnop", "committed": "QRSTUVWXYZqrstuv"}
SEP = "\u241f"  # ␟ between pieces: printable (JSON keeps it one character), and no piece shows it
TEXT_CHARS = 600  # the committed text a card carries: its end, where the run is writing
PROMPT_CHARS = 80
PINNABLE_POSITIONS = 4096  # past this many canvas positions in a batch, finished cards carry no pinnable pieces
SCHEMA = {"cells": CELLS, "levels": LEVELS, "sep": SEP}  # what assets/board_view.js reads of this module

# Special tokens would take five cells each on a canvas of characters: one symbol instead.
_SPECIAL = {"<pad>": "▫", "<eos>": "■", "<bos>": "▸", "<unk>": "?"}
MAX_CELL = 12  # characters a canvas cell shows; a longer piece is clipped, in full on hover
# Whitespace pieces would be invisible on a canvas; show them as visible marks instead.
_VISIBLE = str.maketrans({"\n": "↵", "\t": "⇥", "\r": "␍"})


def is_special(text: str) -> bool:
    return text in _SPECIAL or (len(text) > 2 and text.startswith("<") and text.endswith(">"))


def shown_piece(text: str) -> str:
    """What a canvas cell shows of a piece (plain text: the browser escapes it)."""
    # A space keeps its cell (white-space: pre) and its shading, as does SentencePiece's '▁' (a
    # space in the text); line breaks and tabs become visible marks, an empty piece a mark of its own.
    if is_special(text):
        return _SPECIAL.get(text, "◆")
    shown = text.replace("▁", " ").translate(_VISIBLE) or "∅"
    if len(shown) > MAX_CELL:
        shown = shown[: MAX_CELL - 1] + "…"
    return shown


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


def refinable(view: RequestView) -> bool:
    """A finished request with text and a seed can be run again from its text."""
    return view.status == "done" and bool(view.committed_text) and view.seed is not None


def level(p: float) -> int:
    """A probability in [0, 1] as one of LEVELS steps (0: flat, LEVELS - 1: certain)."""
    return 0 if not math.isfinite(p) or p <= 0 else min(LEVELS - 1, int(p * LEVELS))


@functools.lru_cache(maxsize=1 << 16)
def _shown(piece: str) -> str:
    """A piece as its cell shows it (a run repeats its pieces: each is worked out once)."""
    return shown_piece(piece).replace(SEP, "?")


def _join(pieces: list[str] | tuple[str, ...]) -> str:
    return SEP.join(map(_shown, pieces))


def _cells(entropies: tuple[float, ...], accepted: tuple[bool, ...], committed: bool) -> str:
    """A live canvas's cells: `level(confidence(entropy))` for each position, inlined (a frame at
    32 x 256 has 8,192 of them; a function call each was most of a slider step's time)."""
    top, exp = LEVELS - 1, math.exp
    if committed:
        chars = CELLS["committed"]
        return "".join(chars[min(top, int(exp(-e) * LEVELS)) if e >= 0 else 0] for e in entropies)
    acc, noise = CELLS["accepted"], CELLS["noise"]
    return "".join((acc if a else noise)[min(top, int(exp(-e) * LEVELS)) if e >= 0 else 0]
                   for e, a in zip(entropies, accepted, strict=False))


def _live(view: RequestView) -> dict:
    """The canvas being denoised: accepted or re-noised (committed when it has converged)."""
    step = view.last_step
    committed = view.status == "converged" or step.converged
    cells = _cells(step.entropy, step.accepted, committed)
    accepted = sum(step.accepted)
    meter = (f"canvas {step.canvas_index + 1} · accepted {accepted}/{len(step.accepted)} · mean entropy "
             f"{step.mean_entropy:.3g} (confident below {step.confidence_threshold:g})")
    return {"cells": cells, "pieces": _join(step.pieces), "meter": meter, "step": step.step}


def _committed(view: RequestView, canvas_length: int) -> dict:
    """A request between canvases or finished: its last committed canvas, by probability."""
    pieces = view.committed_pieces
    if not pieces:
        return {"cells": "", "pieces": "", "meter": "", "step": None}
    if canvas_length <= 0:  # not known: every committed canvas but the last is whole
        canvas_length = -(-len(pieces) // max(1, view.canvases))
    start = (view.canvases - 1) * canvas_length if view.canvases else 0
    if not 0 <= start < len(pieces):  # pieces seen by a reader that joined late
        start = max(0, len(pieces) - canvas_length)
    last = pieces[start:start + canvas_length]
    logprobs = view.committed_logprobs[start:start + canvas_length] if len(view.committed_logprobs) == len(pieces) else []
    cells = "".join(CELLS["committed"][level(math.exp(lp)) if logprobs else LEVELS - 1] for lp in (logprobs or last))
    meter = f"canvas {view.canvases} committed · {len(pieces)} tokens in all"
    return {"cells": cells, "pieces": _join(last), "meter": meter, "step": None}


def _finished(view: RequestView, length: int, pinnable: bool) -> dict:
    """A finished request's Refine mark (`refine`; its click names the row, and the server reads the
    start text off the tab's run: a frame at 32 x 256 has no room for 32 first canvases' text) and,
    when `pinnable` and the pieces spell the text, its first canvas's pieces for click-to-pin
    (SEP-joined, a special token empty: it shows nothing). Sent once: a finished row no longer changes."""
    if not refinable(view):
        return {}
    raw = view.committed_pieces
    shown = "".join("" if is_special(p) else p.replace("▁", " ") for p in raw)
    if pinnable and length > 0 and shown == view.committed_text and SEP not in "".join(raw[:length]):
        return {"refine": 1, "first": SEP.join("" if is_special(p) else p for p in raw[:length])}
    return {"refine": 1}


def row(view: RequestView, canvas_length: int, note: str = "", pinnable: bool = True, refine: bool = True) -> dict:
    """One request: its card's head and its canvas as cells and pieces (and, finished, what its Refine
    needs, when `refine`)."""
    prompt = view.prompt[:PROMPT_CHARS] + ("…" if len(view.prompt) > PROMPT_CHARS else "")
    canvas = _live(view) if view.last_step is not None else _committed(view, canvas_length)
    text = view.committed_text if len(view.committed_text) <= TEXT_CHARS else "…" + view.committed_text[1 - TEXT_CHARS:]
    return {
        "index": view.index, "request": view.request_id, "seed": view.seed, "status": view.status,
        "label": status_text(view), "prompt": prompt, "note": note, "text": text,
        **canvas,
        **(_finished(view, canvas_length, pinnable) if refine else {}),
    }  # fmt: skip


def frame(board: Board, length: int | None = None, refine: bool = True) -> dict:
    """The whole board as one frame. `length`: the canvas length (default: the board's, from its step
    frames). `refine`: finished cards carry their Refine (and click-to-pin) data; a view without Refine
    (the lesson's) sends none."""
    length = length or board.canvas_length
    # Click-to-pin sends each finished card's first canvas, pieces the frame has not carried since its
    # canvas committed: affordable for a batch of moderate size, not within 64 KB a frame at 32 x 256.
    pinnable = len(board.requests) * length <= PINNABLE_POSITIONS
    return {
        "canvas_length": length, "threshold": board.confidence_threshold, "calls": board.plan_count,
        "rows": [row(v, length, board.notes.get(v.index, ""), pinnable, refine) for v in board.requests.values()],
    }  # fmt: skip
