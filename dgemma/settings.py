"""One call's settings, parsed the same way by the CLI, the API and the UI.

`Settings` = `SamplingParams` (what decides the tokens) + `RunOptions` (how the run is laid out in
memory) + `max_new_tokens`. `parse_settings` takes name: value pairs as any front end has them
(CLI names, dashes or underscores; text, JSON numbers or None for "the default") and lets the
two types check them against their one table of bounds (dgemma/sampling/params.py), so a
mistake reads the same sentence everywhere. `seed` S gives the i-th prompt the seed S + i.

`start` (text for the first canvas to start from) and `pins` ({position: token text} held in the
first canvas) are one value for every prompt or a list aligned with the prompts; they are kept one
per prompt. Whether a piece is one token and a position inside the canvas is the model's to say
(dgemma/sampling/start.py, at submit).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from dgemma.errors import SettingsError
from dgemma.sampling import MAX_SEED, Bound, RunOptions, SamplingParams, check_number, parse_tiling
from dgemma.sampling.start import pin_position, resolve_start

PARAM_NAMES = tuple(f.name for f in fields(SamplingParams))
OPTION_NAMES = tuple(f.name for f in fields(RunOptions) if not f.metadata.get("internal"))  # the lesson's are no setting
CANVAS_NAMES = ("start", "pins")
NAMES = ("max_new_tokens", *PARAM_NAMES, *OPTION_NAMES, *CANVAS_NAMES)

PinTexts = tuple[tuple[int, str], ...]  # (position, token text), positions ascending


@dataclass(frozen=True)
class Settings:
    """What one call asks for: its prompts' sampling params, its run options, its length."""

    params: SamplingParams = field(default_factory=SamplingParams)
    options: RunOptions = field(default_factory=RunOptions)
    max_new_tokens: int = 32
    start: tuple[str | None, ...] = ()  # one per prompt (empty: none starts from text)
    pins: tuple[PinTexts, ...] = ()  # one per prompt (empty: none pins)

    def request_params(self, index: int) -> SamplingParams:
        """The `index`-th prompt's params: seed S + index (parse_settings checked there is room)."""
        return self.params.for_prompt(index)

    def request_canvas(self, index: int) -> dict[str, Any]:
        """The `index`-th prompt's first canvas as the engine's `submit` takes it: start=, pins=."""
        start = self.start[index] if self.start else None
        pins = dict(self.pins[index]) if self.pins else {}
        return dict(start=start, pins=pins or None)

    def canvas_problem(self, prompts: int, canvas_length: int, encode: Callable[[str], list[int]]) -> str:
        """One sentence about the first prompt whose start or pins the model cannot take (a piece that
        is not one token, a position outside the canvas, a start longer than it), else ''."""
        for i in range(prompts if self.start or self.pins else 0):
            canvas = self.request_canvas(i)
            error, _ = resolve_start(canvas["start"], canvas["pins"], canvas_length, encode)
            if error:
                return f"prompt {i + 1}: {error}" if prompts > 1 else error
        return ""


def _per_prompt(name: str, value: Any, prompts: int, one: Any) -> tuple:
    """One value for every prompt, or a list aligned with the prompts: one checked value per prompt."""
    if isinstance(value, (list, tuple)):
        if len(value) != prompts:
            raise SettingsError(f"Setting '{name}' has {len(value)} entries for {prompts} prompts; give one value "
                                "for every prompt or a list with one per prompt.")
        return tuple(one(v) for v in value)
    return (one(value),) * prompts


def _start(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value or None
    raise SettingsError(f"Setting 'start' must be text, got {type(value).__name__}.")


def _pins(value: Any) -> PinTexts:
    if value is None:
        return ()
    if not isinstance(value, Mapping):
        raise SettingsError(f"Setting 'pins' must be an object of position: token text pairs, got {type(value).__name__}.")
    held: dict[int, str] = {}
    for key, piece in value.items():
        try:
            position = pin_position(key)
        except ValueError as err:
            raise SettingsError(f"Setting 'pins': {err}.") from None
        if not isinstance(piece, str) or not piece:
            got = "empty text" if piece == "" else type(piece).__name__
            raise SettingsError(f"Setting 'pins': the token at position {position} must be text, got {got}.")
        held[position] = piece
    return tuple(sorted(held.items()))


def run_options(settings: Settings, server_budget: int | None) -> RunOptions:
    """The run's layout for the engine: a budget equal to the server's own is no budget of its own."""
    if settings.options.memory_budget == server_budget:
        return replace(settings.options, memory_budget=None)
    return settings.options


def parse_settings(
    raw: Mapping[str, Any] | None,
    defaults: Settings,
    *,
    max_new_tokens: int | None = None,
    max_tile: int | None = None,
    prompts: int = 1,
) -> Settings:
    """Checked settings: `defaults` overridden by `raw`; a SettingsError (one sentence) on any mistake.

    `max_new_tokens` caps the length, `max_tile` a fixed tile size (the engine's max_num_seqs),
    and `prompts` is how many prompts share the seed S (prompt i gets S + i, which must stay a seed).
    """
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        raise SettingsError(f"Settings must be an object of name: value pairs, got {type(raw).__name__}.")
    params: dict[str, Any] = {}
    options: dict[str, Any] = {}
    canvas: dict[str, Any] = {}
    length = defaults.max_new_tokens
    for key, value in raw.items():
        name = str(key).replace("-", "_")
        if name not in NAMES:
            raise SettingsError(f"Unknown setting {str(key)[:40]!r}; known settings: {', '.join(NAMES)}.")
        if value is None:
            continue  # null means "the default", as an omitted key does
        if name == "max_new_tokens":
            length = check_number(name, value, Bound(int, 1, max_new_tokens or math.inf))
        elif name == "tiling":
            options[name] = parse_tiling(value, max_tile)
        elif name in OPTION_NAMES:
            options[name] = value
        elif name in CANVAS_NAMES:
            canvas[name] = _per_prompt(name, value, prompts, _start if name == "start" else _pins)
        else:
            params[name] = value
    for name, values in list(canvas.items()):
        if not any(values):
            canvas[name] = ()  # nothing asked: the same as not given
    settings = Settings(replace(defaults.params, **params), replace(defaults.options, **options), int(length),
                        **canvas)
    last = settings.params.seed + prompts - 1
    if last > MAX_SEED:
        raise SettingsError(f"Setting 'seed' must be at most {MAX_SEED - prompts + 1} for {prompts} prompts "
                            f"(prompt i gets seed + i), got {settings.params.seed}.")
    return settings
