"""How a request's first canvas starts: from starting tokens (edit) and with pinned tokens (infill).

`CanvasStart` is the token-level form the sampler reads; `resolve_start` builds it from the
text a caller gives (a start text, {position: piece} pins) with the model's tokenizer, or says in
one sentence why it cannot. No torch here: the engine checks a request with it at submit.

- start: its tokens fill the first canvas from position 0 and the rest start from the keyed
  noise, the semantics of transformers' `decoder_input_ids` (a starting state, re-noised like any
  other token where the first step does not accept it);
- pins: positions of the first canvas held at their token for the whole denoising: the step
  never re-noises them and the committed canvas holds them (their entropy is still the model's).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

Pins = tuple[tuple[int, int], ...]  # (position, token id), positions ascending


@dataclass(frozen=True)
class CanvasStart:
    """The first canvas's starting tokens (from position 0) and its pinned (position, token) pairs."""

    tokens: tuple[int, ...] = ()
    pins: Pins = ()

    def __bool__(self) -> bool:
        return bool(self.tokens or self.pins)

    def canvas(self, noise: list[int]) -> list[int]:
        """The starting canvas: `noise` with the start tokens over its head and the pins at their places."""
        canvas = list(self.tokens) + list(noise[len(self.tokens):])
        for position, token in self.pins:
            canvas[position] = token
        return canvas


def pin_position(key: object) -> int:
    """A pin's position from an int or its text ("3" from JSON keys); ValueError with one sentence."""
    text = str(key).strip() if isinstance(key, (int, str)) and not isinstance(key, bool) else None
    if text is None or not text.isdigit():
        raise ValueError(f"a pin's position must be a whole number from 0, got {str(key)[:40]!r}")
    return int(text)


def resolve_start(start: str | None, pins: Iterable[tuple[int, str]], canvas_length: int,
                  encode: Callable[[str], list[int]]) -> tuple[str, CanvasStart]:
    """One sentence if the start or a pin cannot be used, else '' and the request's CanvasStart.

    `start` (text) and `pins` ((position, piece) pairs, a piece non-empty text) as the door
    (dgemma/settings.py) has checked them; `encode` turns text into token ids without special tokens.
    A start longer than the canvas, a position outside it, or a piece that is not exactly one token of
    the vocabulary is refused.
    """
    tokens = encode(start) if start else []
    if len(tokens) > canvas_length:
        return (f"the start text is {len(tokens)} tokens but the canvas holds {canvas_length}; "
                f"shorten it to the first canvas"), CanvasStart()
    held: dict[int, int] = {}
    for position, piece in pins:
        if position >= canvas_length:
            return (f"pin position {position} is outside the canvas (positions 0 to {canvas_length - 1})",
                    CanvasStart())
        ids = encode(piece)
        if len(ids) != 1:
            return (f"the pin at position {position} ({piece[:40]!r}) is not one token of the vocabulary "
                    f"(it is {len(ids)} tokens)"), CanvasStart()
        held[position] = ids[0]
    return "", CanvasStart(tuple(tokens), tuple(sorted(held.items())))
