"""One call's settings: declared once (`SETTINGS`), parsed the same way by the CLI, the API and the UI.

`SETTINGS` is the one table of every setting a visitor can give; the page's panel, the CLI's flags, the
API's documentation (`api_help`) and Compare's panel are made from it. A new setting is a field of
`SamplingParams`, `RunOptions` or a scheduler's parameters (its check beside it) and a row here.
`make_request` is the one door a call comes in by: past it nothing parses again (docs/architecture.md,
"dgemma/settings.py", says what each piece checks and why).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

from dgemma.errors import SettingsError
from dgemma.sampling import MAX_SEED, MAX_STABILITY, SAMPLER_STEPS, Bound, RunOptions, SamplingParams, check_number, parse_tiling
from dgemma.sampling.bounds import check_choice, describe
from dgemma.sampling.params import BOUNDS, parse_budget
from dgemma.sampling.schedulers import SCHEDULER_TABLE, SCHEDULERS, SchedulerParams
from dgemma.sampling.schedulers.discrete_ddim import CORRECTOR_SELECTIONS
from dgemma.sampling.start import CanvasStart, pin_position, resolve_start


@dataclass(frozen=True)
class Setting:
    """One setting as every front end shows it.

    widget: "integer" | "number" | "checkbox" | "choice" (one of `choices`; with `custom`, also
    anything the parser takes, as tiling's N) | "text" (empty: the default) | "pins" (position: token
    pairs). group: where the page puts it ("length", "sampling", "scheduler", "layout": a row of the
    settings panel; "canvas": the first-canvas inputs).
    """

    name: str
    label: str
    help: str
    widget: str
    group: str
    choices: tuple[str, ...] = ()
    custom: bool = False

    @property
    def bound(self) -> Bound | None:
        return BOUNDS.get(self.name) or next((s.Params.BOUNDS[self.name] for s in SCHEDULER_TABLE.values()
                                              if self.name in s.Params.BOUNDS), None)


SETTINGS: tuple[Setting, ...] = (
    Setting("max_new_tokens", "max new tokens", "tokens per request", "integer", "length"),
    Setting("max_denoising_steps", "denoising steps", "denoising steps a canvas may take before it is committed",
            "integer", "length"),
    Setting("seed", "seed (request i gets seed + i)", "request i gets the seed S + i", "integer", "length"),
    Setting("greedy", "greedy", "entropy_bound: argmax sampling, no noise (the others: temperature 0)", "checkbox",
            "length"),
    Setting("t_min", "t_min", "entropy_bound: the lowest noise level of a denoising step", "number", "sampling"),
    Setting("t_max", "t_max", "entropy_bound: the highest noise level of a denoising step (at least t_min)", "number",
            "sampling"),
    Setting("entropy_bound", "entropy bound",
            "entropy_bound: a position is accepted while the entropy it adds stays under this", "number", "sampling"),
    Setting("confidence_threshold", "confidence threshold",
            "a canvas converges when its mean entropy drops below this", "number", "sampling"),
    Setting("stability_threshold", "stability threshold",
            f"steps the draft must stay unchanged to converge (at most {MAX_STABILITY})", "integer", "sampling"),
    Setting("scheduler", "scheduler", "entropy_bound: accept positions while their entropy stays under the bound; "
            "block_refinement: commit the most confident, an even share of the canvas a step; discrete_ddim: the "
            "uniform corruption's posterior, with optional corrector sweeps", "choice", "scheduler", SCHEDULERS),
    Setting("temperature", "temperature", "block_refinement and discrete_ddim: the sample's temperature (0: argmax)",
            "number", "scheduler"),
    Setting("commit_threshold", "commit threshold", "block_refinement: a position whose confidence is above this "
            "commits beyond the step's share", "number", "scheduler"),
    Setting("editing_threshold", "editing threshold", "block_refinement: a committed token is replaced when the model "
            "prefers another with confidence above this; empty or off: no editing", "text", "scheduler"),  # a page's
    # number field cannot hold "off": it shows 0, which would edit
    Setting("corrector_steps", "corrector steps", "discrete_ddim: corrector sweeps (one decoder forward each) after "
            "each early step, within the denoising steps", "integer", "scheduler"),
    Setting("corrector_k", "corrector k", "discrete_ddim: positions each corrector sweep resamples", "integer",
            "scheduler"),
    Setting("corrector_selection", "corrector selection", "discrete_ddim: how a sweep picks the positions it "
            "resamples", "choice", "scheduler", CORRECTOR_SELECTIONS),
    Setting("corrector_selection_tau", "corrector selection tau", "discrete_ddim: temperature of the sweep's "
            "position pick (lower: greedier)", "number", "scheduler"),
    Setting("tiling", "tiling", "auto: tiles sized from free memory; off: one tile; N: N requests per tile",
            "choice", "layout", ("auto", "off"), custom=True),
    Setting("sampler", "sampler step", "reference: eager, ~2 fp32 vocab copies per request (~1 on a CPU); "
            "chunked: streams the vocabulary", "choice", "layout", SAMPLER_STEPS),
    Setting("memory_budget", "memory budget", "e.g. 64MiB caps this run's sampler step (CPU virtual device, CUDA "
            "per-process cap); empty: the server's", "text", "layout"),
    Setting("start", "Start from", "text the first canvas starts from: its tokens from position 0 (transformers' "
            "decoder_input_ids); the model may change any of them", "text", "canvas"),
    Setting("pins", "Pins (position=token, one per line)", "one-token texts held at their positions of the first "
            "canvas for the whole denoising", "pins", "canvas"),
)
NAMES = tuple(s.name for s in SETTINGS)
BY_NAME = {s.name: s for s in SETTINGS}
PARAM_NAMES = tuple(f.name for f in fields(SamplingParams) if f.name in BY_NAME)
OPTION_NAMES = tuple(f.name for f in fields(RunOptions) if f.name in BY_NAME)  # a run's internal options are no setting
# Each scheduler's own options (sampling/schedulers/), by name: the first scheduler's parameters' class that has it.
SCHEDULER_OPTIONS = {option: s.Params for s in reversed(SCHEDULER_TABLE.values()) for option in s.Params.options()}
CANVAS_NAMES = ("start", "pins")

PinTexts = tuple[tuple[int, str], ...]  # (position, token text), positions ascending


@dataclass(frozen=True)
class Settings:
    """What one call asks for: its prompts' sampling params, its run options, its length."""

    params: SamplingParams = field(default_factory=SamplingParams)
    options: RunOptions = field(default_factory=RunOptions)
    max_new_tokens: int = 32
    start: tuple[str | None, ...] = ()  # one per prompt (empty: none starts from text)
    pins: tuple[PinTexts, ...] = ()  # one per prompt (empty: none pins)

    def value(self, name: str) -> Any:
        """The value of setting `name` (a name of SETTINGS); a scheduler's option that the settings'
        scheduler has not, at its own scheduler's default."""
        if name == "scheduler":
            return self.params.scheduler.name
        if name in PARAM_NAMES:
            return getattr(self.params, name)
        if name in SCHEDULER_OPTIONS:
            return getattr(self.params.scheduler, name, getattr(SCHEDULER_OPTIONS[name](), name))
        if name in OPTION_NAMES:
            return getattr(self.options, name)
        return getattr(self, name)


@dataclass(frozen=True)
class Limits:
    """What one call or one tab may ask for, so that one client cannot starve the others."""

    max_prompts: int = 64  # prompts in one call (after filling up to `concurrent`)
    max_new_tokens: int = 256
    max_queued: int = 64  # requests one tab (a browser tab, an API client) may have waiting or running at once
    max_prompt_chars: int = 4000
    max_denoising_steps: int = int(BOUNDS["max_denoising_steps"].high)  # a tab's own cap (the lesson's) may be lower


@dataclass(frozen=True)
class CanvasModel:
    """What resolving a first canvas reads of the model: its canvas length, and text to token ids."""

    canvas_length: int
    encode: Callable[[str], list[int]]


@dataclass(frozen=True)
class RunRequest:
    """One call, checked and resolved: its prompts, its settings and each prompt's first canvas."""

    prompts: tuple[str, ...]
    settings: Settings = field(default_factory=Settings)
    canvases: tuple[CanvasStart, ...] = ()  # one per prompt; empty: every first canvas starts from noise

    def canvas(self, index: int) -> CanvasStart | None:
        """The `index`-th prompt's first canvas (None: noise)."""
        return (self.canvases[index] or None) if self.canvases else None


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


def name_value_pairs(parts: Iterable[str], problem: str) -> dict[str, str]:
    """`name=value` parts as {name: value}: the name stripped, the value as written (it may hold '='),
    blank parts skipped. A part without a name or an '=' raises SettingsError(`problem`), whose
    `{part!r}` is that part (its first 40 characters)."""
    pairs: dict[str, str] = {}
    for part in parts:
        if not part.strip():
            continue
        name, sep, value = part.partition("=")
        if not sep or not name.strip():
            raise SettingsError(problem.format(part=part.strip()[:40]))
        pairs[name.strip()] = value
    return pairs


def parse_prompts(prompts: Any, limits: Limits) -> list[str]:
    """Prompts as given (order kept); one sentence when the list is empty, too long or malformed."""
    if isinstance(prompts, str):
        prompts = [prompts]
    if not isinstance(prompts, (list, tuple)):
        raise SettingsError(f"Prompts must be a list of strings, got {type(prompts).__name__}.")
    if not prompts:
        raise SettingsError("Give at least one prompt.")
    if len(prompts) > limits.max_prompts:
        raise SettingsError(f"Too many prompts: {len(prompts)} given, at most {limits.max_prompts} per call.")
    out = []
    for i, prompt in enumerate(prompts):
        if not isinstance(prompt, str):
            raise SettingsError(f"Prompt {i + 1} must be a string, got {type(prompt).__name__}.")
        if not prompt.strip():
            raise SettingsError(f"Prompt {i + 1} is empty; write some text or remove it.")
        if len(prompt) > limits.max_prompt_chars:
            raise SettingsError(f"Prompt {i + 1} is {len(prompt)} characters long; the limit is {limits.max_prompt_chars}.")
        # Lone surrogates cannot be encoded or tokenized; say so instead of failing deep inside.
        try:
            prompt.encode("utf-8")
        except UnicodeEncodeError:
            raise SettingsError(f"Prompt {i + 1} holds characters that are not valid Unicode text.") from None
        out.append(prompt)
    return out


def resolve_canvases(settings: Settings, prompts: int, canvas_model: Callable[[], CanvasModel]
                     ) -> tuple[CanvasStart, ...]:
    """Each prompt's first canvas from its start and pins (the model asked for only then); SettingsError
    naming the first prompt whose start or pins the model cannot take (a piece that is not one token, a
    position outside the canvas, a start longer than it)."""
    if not (settings.start or settings.pins):
        return ()
    model, canvases = canvas_model(), []
    for i in range(prompts):
        start = settings.start[i] if settings.start else None
        pins = settings.pins[i] if settings.pins else ()
        error, canvas = resolve_start(start, pins, model.canvas_length, model.encode)
        if error:
            raise SettingsError(f"prompt {i + 1}: {error}" if prompts > 1 else error)
        canvases.append(canvas)
    return tuple(canvases)


def make_request(prompts: Any, raw: Any, defaults: Settings, limits: Limits, max_tile: int,
                 canvas_model: Callable[[], CanvasModel]) -> RunRequest:
    """The one door of a call: its prompts checked under `limits`, `raw` (name: value pairs as a front end
    has them; None: none) parsed over `defaults`, a fixed tile of at most `max_tile`, and each first
    canvas resolved against the model `canvas_model()` gives (asked only when a prompt starts from text
    or holds pins; a model not loaded yet raises its own sentence). SettingsError (a ValueError): one sentence."""
    batch = parse_prompts(prompts, limits)
    settings = parse_settings(raw, defaults, max_new_tokens=limits.max_new_tokens, max_tile=max_tile,
                              max_denoising_steps=limits.max_denoising_steps, prompts=len(batch))
    return RunRequest(tuple(batch), settings, resolve_canvases(settings, len(batch), canvas_model))


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
    max_denoising_steps: int | None = None,
    prompts: int = 1,
) -> Settings:
    """Checked settings: `defaults` overridden by `raw`; a SettingsError (one sentence) on any mistake.

    `max_new_tokens` caps the length, `max_denoising_steps` the steps a canvas may take (below their
    bound), `max_tile` a fixed tile size (the engine's max_num_seqs),
    and `prompts` is how many prompts share the seed S (prompt i gets S + i, which must stay a seed).
    """
    raw = {} if raw is None else raw
    if not isinstance(raw, Mapping):
        raise SettingsError(f"Settings must be an object of name: value pairs, got {type(raw).__name__}.")
    params: dict[str, Any] = {}
    chosen: dict[str, Any] = {}  # the schedulers' own options
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
            length = check_number(name, value, replace(BOUNDS[name], high=max_new_tokens or math.inf))
        elif name == "max_denoising_steps" and max_denoising_steps:
            params[name] = check_number(name, value, replace(BOUNDS[name], high=min(max_denoising_steps, BOUNDS[name].high)))
        elif name == "tiling":
            options[name] = parse_tiling(value, max_tile)
        elif name == "memory_budget":
            options[name] = parse_budget(value)
        elif name in OPTION_NAMES:
            options[name] = value
        elif name in CANVAS_NAMES:
            canvas[name] = _per_prompt(name, value, prompts, _start if name == "start" else _pins)
        elif name in SCHEDULER_OPTIONS:
            chosen[name] = value
        else:
            params[name] = value
    canvas = {name: values if any(values) else () for name, values in canvas.items()}  # nothing asked: as not given
    scheduler = params.pop("scheduler", None)
    sampling = replace(defaults.params, **SamplingParams.parse(params))
    sampling = replace(sampling, scheduler=_scheduler(scheduler, chosen, sampling.scheduler))
    settings = Settings(sampling, replace(defaults.options, **options), int(length), **canvas)
    last = settings.params.seed + prompts - 1
    if last > MAX_SEED:
        raise SettingsError(f"Setting 'seed' must be at most {MAX_SEED - prompts + 1} for {prompts} prompts "
                            f"(prompt i gets seed + i), got {settings.params.seed}.")
    return settings


def _scheduler(name: Any, given: Mapping[str, Any], default: SchedulerParams) -> SchedulerParams:
    """The scheduler `name` (None: `default`'s) with the options `given` that are its own, over
    `default`'s when it is the same scheduler; another scheduler's option is checked and left aside
    (a front end sends every scheduler's)."""
    name = default.name if name is None else check_choice("scheduler", name, SCHEDULERS)
    own = SCHEDULER_TABLE[name].Params.options()
    for option, value in given.items():
        if option not in own:
            SCHEDULER_OPTIONS[option].parse({option: value})
    mine = SCHEDULER_TABLE[name].Params.parse(given)
    return replace(default, **mine) if default.name == name else SCHEDULER_TABLE[name].Params(**mine)


def api_help() -> str:
    """The settings as the API's documentation lists them: each name, what it takes, and its help."""

    def line(s: Setting) -> str:
        kind = {"checkbox": "true | false", "pins": '{"position": "token text"}', "text": "text"}.get(s.widget, "")
        if s.widget == "choice":
            kind = " | ".join(s.choices) + (" | N" if s.custom else "")
        elif s.bound is not None:
            kind = describe(s.bound)
        return f"{s.name} [{kind}]: {s.help}"

    return "; ".join(line(s) for s in SETTINGS)
