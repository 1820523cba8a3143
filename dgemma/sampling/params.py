"""What a request asks of the sampler (`SamplingParams`) and how a run is executed (`RunOptions`).

`SamplingParams` are per request and decide its tokens; `RunOptions` (tiling, the step
implementation, a memory budget) decide only how the work is laid out in memory, never the
tokens. Both check and normalise their fields on construction against ONE table of bounds
(`BOUNDS`), so a value from the command line ("16"), JSON (16.0) or code (16) is accepted or
refused the same way, with the same sentence (a `SettingsError`, which is a ValueError).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from typing import Any

from dgemma.errors import SettingsError
from dgemma.units import parse_size

MAX_STABILITY = 8  # history depth preallocated per slot; stability_threshold may not exceed it
# The step implementations' names; sampling/steps.py maps each to its tile function. Typed only here,
# where RunOptions checks them without importing torch.
SAMPLER_STEPS = ("reference", "chunked")
# The schedulers a request may denoise with (diffusers 0.42.1's three for Diffusion-Gemma; docs/design.md,
# the schedulers): what a step accepts, commits and re-noises. Each is a class in
# sampling/schedulers.py (`SCHEDULER_TABLE`, in this order); here, torch-free, for the settings.
SCHEDULERS = ("entropy_bound", "block_refinement", "discrete_ddim")
# How discrete DDIM's corrector picks the positions it resamples (diffusers' `corrector_selection`).
CORRECTOR_SELECTIONS = ("lowest_log_margin", "lowest_maxprob", "lowest_current_prob", "random")
CHOICES = {"scheduler": SCHEDULERS, "corrector_selection": CORRECTOR_SELECTIONS}

MAX_SEED = 2**63 - 1  # a request's seed is a signed 64-bit integer; seed S gives prompt i the seed S + i


@dataclass(frozen=True)
class Bound:
    """A numeric setting: its kind and inclusive range (`above`: the low end itself is refused)."""

    kind: type  # int or float
    low: float
    high: float
    above: bool = False


BOUNDS: dict[str, Bound] = {
    "max_new_tokens": Bound(int, 1, math.inf),  # a server lowers the top to its own cap
    "max_denoising_steps": Bound(int, 1, 512),
    "t_min": Bound(float, 1e-3, 10.0),
    "t_max": Bound(float, 1e-3, 10.0),
    "entropy_bound": Bound(float, 0.0, math.inf, above=True),
    "confidence_threshold": Bound(float, 0.0, math.inf, above=True),
    "stability_threshold": Bound(int, 0, MAX_STABILITY),
    "seed": Bound(int, 0, MAX_SEED),
    "temperature": Bound(float, 0.0, 10.0),
    "commit_threshold": Bound(float, 0.0, 1.0),
    "editing_threshold": Bound(float, 0.0, 1.0),
    "corrector_steps": Bound(int, 0, 64),
    "corrector_k": Bound(int, 1, 4096),
    "corrector_selection_tau": Bound(float, 0.0, math.inf, above=True),
}


def _shown(value: Any) -> str:
    return repr(value if not isinstance(value, str) else value[:40])


def _limit(value: float, kind: type) -> str:
    return str(int(value)) if kind is int else f"{value:g}"


def describe(bound: Bound) -> str:
    """A bound as the documentation reads it: "a whole number from 1 to 512", "a number above 0"."""
    kind, low = ("a whole number" if bound.kind is int else "a number"), _limit(bound.low, bound.kind)
    if math.isinf(bound.high):
        return f"{kind} {'above' if bound.above else 'from'} {low}"
    return f"{kind} {'above' if bound.above else 'from'} {low} {'and at most' if bound.above else 'to'} {_limit(bound.high, bound.kind)}"


def check_number(name: str, value: Any, bound: Bound) -> int | float:
    """`value` (a number or its text) as `bound.kind`, or a SettingsError naming the setting."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise SettingsError(f"Setting '{name}' must be a number, got {type(value).__name__}.")
    number: int | float
    try:
        number = int(value.strip()) if isinstance(value, str) and bound.kind is int else float(value)
    except ValueError:
        try:  # "16.0" for a whole number: judged below like 16.0
            number = float(value)
        except ValueError:
            raise SettingsError(f"Setting '{name}' must be a number, got {_shown(value)}.") from None
    if isinstance(number, float) and not math.isfinite(number):
        raise SettingsError(f"Setting '{name}' must be a finite number, got {_shown(value)}.")
    if bound.kind is int:
        if number != int(number):
            raise SettingsError(f"Setting '{name}' must be a whole number, got {_shown(value)}.")
        number = int(value) if isinstance(value, int) else int(number)  # ints keep all 64 bits
    if (bound.low < number if bound.above else bound.low <= number) and number <= bound.high:
        return number
    low = _limit(bound.low, bound.kind)
    if math.isinf(bound.high):
        floor = f"greater than {low}" if bound.above else f"at least {low}"
        raise SettingsError(f"Setting '{name}' must be {floor}, got {_shown(value)}.")
    high = _limit(bound.high, bound.kind)
    if bound.above:
        raise SettingsError(f"Setting '{name}' must be greater than {low} and at most {high}, got {_shown(value)}.")
    raise SettingsError(f"Setting '{name}' must be between {low} and {high}, got {_shown(value)}.")


def check_choice(name: str, value: Any, choices: tuple[str, ...]) -> str:
    """One of `choices` (any case, surrounding spaces ignored), or a SettingsError naming them."""
    text = value.strip().lower() if isinstance(value, str) else None
    if text in choices:
        return text
    raise SettingsError(f"Setting '{name}' must be one of {', '.join(choices)}, got {_shown(value)}.")


def check_bool(name: str, value: Any) -> bool:
    """true/false, 1/0, yes/no (any case) as a bool, or a SettingsError."""
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in ("true", "false", "1", "0", "yes", "no"):
        return value.strip().lower() in ("true", "1", "yes")
    raise SettingsError(f"Setting '{name}' must be true or false, got {_shown(value)}.")


@dataclass(frozen=True)
class SamplingParams:
    """Per-request sampling settings; the defaults are transformers' DiffusionGemma defaults.

    `scheduler` picks the step (SCHEDULERS); each reads its own options and ignores the others':
    entropy_bound reads t_min, t_max, entropy_bound and greedy; block_refinement reads temperature,
    commit_threshold (diffusers' `threshold`) and editing_threshold (None: no editing; any number,
    0 included, edits as diffusers does); discrete_ddim reads temperature and the corrector_*
    options (diffusers' names). `max_denoising_steps` is diffusers' `num_inference_steps` (with
    corrector sweeps, the forwards a canvas may take), the stopping rule (confidence_threshold,
    stability_threshold) is every scheduler's.
    """

    max_denoising_steps: int = 48
    t_min: float = 0.4
    t_max: float = 0.8
    entropy_bound: float = 0.1
    confidence_threshold: float = 0.005
    stability_threshold: int = 1
    greedy: bool = False
    seed: int = 0
    scheduler: str = "entropy_bound"
    temperature: float = 0.0  # block_refinement and discrete_ddim: 0 is greedy (argmax)
    commit_threshold: float = 0.95
    editing_threshold: float | None = None
    corrector_steps: int = 0
    corrector_k: int = 1
    corrector_selection: str = "lowest_log_margin"
    corrector_selection_tau: float = 1.0

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Normalise each field ("16" -> 16) and check it against BOUNDS; a SettingsError on the first bad one."""
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "greedy":
                checked = check_bool(f.name, value)
            elif f.name in CHOICES:
                checked = check_choice(f.name, value, CHOICES[f.name])
            elif f.name == "editing_threshold" and (value is None or str(value).strip().lower() in ("", "off", "none")):
                checked = None  # no editing (a front end's empty box or "off")
            else:
                checked = check_number(f.name, value, BOUNDS[f.name])
            object.__setattr__(self, f.name, checked)
        if self.t_max < self.t_min:
            raise SettingsError(f"Setting 't_max' ({self.t_max:g}) must not be below 't_min' ({self.t_min:g}).")

    def for_prompt(self, index: int) -> SamplingParams:
        """The `index`-th prompt's params of a call seeded S: seed S + index, all else the same."""
        return replace(self, seed=self.seed + index)

    @classmethod
    def from_generation_config(cls, config: object, **overrides: object) -> SamplingParams:
        """Defaults from a model's DiffusionGemmaGenerationConfig, then `overrides`."""
        values: dict[str, object] = {}
        for name in ("max_denoising_steps", "t_min", "t_max", "stability_threshold", "confidence_threshold"):
            if getattr(config, name, None) is not None:
                values[name] = getattr(config, name)
        sampler_config = getattr(config, "sampler_config", None)
        bound = getattr(sampler_config, "entropy_bound", None)
        if bound is None and isinstance(sampler_config, dict):
            bound = sampler_config.get("entropy_bound")
        if bound is not None:
            values["entropy_bound"] = bound
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)


def parse_tiling(tiling: Any, max_tile: int | None = None) -> str | int:
    """'auto' | 'off' | a tile size N (an int or its text; at most `max_tile`) -> the sampler's tiling mode."""
    text = str(tiling).strip().lower() if isinstance(tiling, (str, int)) and not isinstance(tiling, bool) else None
    if text in ("auto", "off"):
        return text
    if text is not None and text.isdigit() and 1 <= int(text) <= (max_tile or math.inf):
        return int(text)
    sizes = f"from 1 to {max_tile}" if max_tile else "of at least 1"
    raise SettingsError(f"Setting 'tiling' must be auto, off, or a tile size {sizes}, got {_shown(tiling)}.")


def parse_budget(budget: Any) -> int | None:
    """A memory budget in bytes from 512MiB-style text or an int (the CLI's --memory-budget syntax); None stays None."""
    if budget is None:
        return None
    try:
        if isinstance(budget, bool) or not isinstance(budget, (str, int)):
            raise ValueError
        return parse_size(budget)
    except ValueError:
        raise SettingsError(f"Setting 'memory_budget' must be a size such as 512MiB or 2GiB, got {_shown(budget)}.") from None


@dataclass(frozen=True)
class RunOptions:
    """How a run is laid out in memory; never changes its tokens.

    tiling: "auto" (the planner sizes tiles from free memory), "off" (one tile) or N requests per
    tile. sampler: the step implementation. memory_budget: bytes (or 512MiB-style text, stored as
    bytes), or None for the device's own free memory.

    Two more are the lesson's, no front end's setting: fail_on_oom: a tile that
    runs out of memory fails the run's requests with the step's numbers, instead of being split
    (and then preempting); pad_vocab: the logits padded to this vocabulary with a large negative
    value (the released model's, on a small model: real-size sampler memory, the small model's
    tokens; padded entries get probability 0).
    """

    tiling: str | int = "auto"
    sampler: str = "reference"
    memory_budget: int | None = None
    fail_on_oom: bool = False
    pad_vocab: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "tiling", parse_tiling(self.tiling))
        if self.sampler not in SAMPLER_STEPS:
            raise SettingsError(f"Setting 'sampler' must be {' or '.join(SAMPLER_STEPS)}, got {_shown(self.sampler)}.")
        object.__setattr__(self, "memory_budget", parse_budget(self.memory_budget))
        if not isinstance(self.fail_on_oom, bool):
            raise SettingsError(f"Option 'fail_on_oom' must be true or false, got {_shown(self.fail_on_oom)}.")
        if self.pad_vocab is not None:
            object.__setattr__(self, "pad_vocab", int(check_number("pad_vocab", self.pad_vocab, PAD_VOCAB)))


PAD_VOCAB = Bound(int, 2, 2**20)  # a padded vocabulary: the released model's 262,144 fits with room
