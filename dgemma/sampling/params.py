"""What a request asks of the sampler (`SamplingParams`) and how a run is executed (`RunOptions`).

`SamplingParams` are per request and decide its tokens; `RunOptions` (tiling, the step
implementation, a memory budget) decide only how the work is laid out in memory, never the
tokens. Both hold typed values, checked on construction against ONE table of bounds (`BOUNDS`,
and each scheduler's own); text is parsed at the edge (dgemma/settings.py, with `parse`,
`parse_tiling`, `parse_budget`: sampling/bounds.py), so a value from the command line ("16"), JSON
(16.0) or code (16) is accepted or refused the same way, with the same sentence (a
`SettingsError`, which is a ValueError).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

from dgemma.errors import SettingsError
from dgemma.sampling.bounds import Bound, check_typed, check_value, shown
from dgemma.sampling.schedulers.base import SchedulerParams
from dgemma.sampling.schedulers.entropy_bound import EntropyBoundParams
from dgemma.units import parse_size

MAX_STABILITY = 8  # history depth preallocated per slot; stability_threshold may not exceed it
# The step implementations' names; sampling/steps.py maps each to its tile function. Typed only here,
# where RunOptions checks them without importing torch.
SAMPLER_STEPS = ("reference", "chunked")

MAX_SEED = 2**63 - 1  # a request's seed is a signed 64-bit integer; seed S gives prompt i the seed S + i


BOUNDS: dict[str, Bound] = {
    "max_new_tokens": Bound(int, 1, math.inf),  # a server lowers the top to its own cap
    "max_denoising_steps": Bound(int, 1, 512),
    "t_min": Bound(float, 1e-3, 10.0),
    "t_max": Bound(float, 1e-3, 10.0),
    "entropy_bound": Bound(float, 0.0, math.inf, above=True),
    "confidence_threshold": Bound(float, 0.0, math.inf, above=True),
    "stability_threshold": Bound(int, 0, MAX_STABILITY),
    "seed": Bound(int, 0, MAX_SEED),
}


@dataclass(frozen=True)
class SamplingParams:
    """Per-request sampling settings; the defaults are transformers' DiffusionGemma defaults.

    `scheduler` is the scheduler's own parameters (sampling/schedulers/, its name the setting
    `scheduler`); the entropy bound reads t_min, t_max, entropy_bound and greedy (the model's
    generation config gives them). `max_denoising_steps` is diffusers' `num_inference_steps` (with
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
    scheduler: SchedulerParams = EntropyBoundParams()

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Check each field against BOUNDS: a SettingsError on the first bad one, a TypeError on text
        (`parse` reads it)."""
        for f in fields(self):
            if f.name != "scheduler":
                check_typed(f.name, getattr(self, f.name), f.default, BOUNDS.get(f.name))
        if not isinstance(self.scheduler, SchedulerParams):
            raise TypeError(f"scheduler must be a scheduler's parameters, got {type(self.scheduler).__name__}")
        if self.t_max < self.t_min:
            raise SettingsError(f"Setting 't_max' ({self.t_max:g}) must not be below 't_min' ({self.t_min:g}).")

    @staticmethod
    def parse(values: Mapping[str, Any]) -> dict[str, Any]:
        """Its fields among `values` (text, JSON numbers or values; not `scheduler`) as it holds them:
        "16" -> 16, "yes" -> True; a SettingsError (one sentence) on a bad one."""
        defaults = {f.name: f.default for f in fields(SamplingParams)}
        return {name: check_value(name, value, defaults[name], BOUNDS.get(name)) for name, value in values.items()}

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
    raise SettingsError(f"Setting 'tiling' must be auto, off, or a tile size {sizes}, got {shown(tiling)}.")


def parse_budget(budget: Any) -> int | None:
    """A memory budget in bytes from 512MiB-style text or an int (the CLI's --memory-budget syntax); None stays None."""
    if budget is None:
        return None
    try:
        if isinstance(budget, bool) or not isinstance(budget, (str, int)):
            raise ValueError
        return parse_size(budget)
    except ValueError:
        raise SettingsError(f"Setting 'memory_budget' must be a size such as 512MiB or 2GiB, got {shown(budget)}.") from None


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
        if self.sampler not in SAMPLER_STEPS:
            raise SettingsError(f"Setting 'sampler' must be {' or '.join(SAMPLER_STEPS)}, got {shown(self.sampler)}.")
        if not isinstance(self.fail_on_oom, bool):
            raise SettingsError(f"Option 'fail_on_oom' must be true or false, got {shown(self.fail_on_oom)}.")
        if self.pad_vocab is not None:
            check_typed("pad_vocab", self.pad_vocab, 0, PAD_VOCAB)
        for name, parse in (("tiling", parse_tiling), ("memory_budget", parse_budget)):
            if parse(getattr(self, name)) != getattr(self, name):
                raise TypeError(f"{name} must be parsed first, got {shown(getattr(self, name))} (dgemma/settings.py parses text)")


PAD_VOCAB = Bound(int, 2, 2**20)  # a padded vocabulary: the released model's 262,144 fits with room
