"""What a request asks of the sampler (`SamplingParams`) and how a run is executed (`RunOptions`).

`SamplingParams` are per request and decide its tokens; `RunOptions` (tiling, the step
implementation, a memory budget) decide only how the work is laid out in memory, never the
tokens. Both validate themselves with one clear sentence per mistake.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from dgemma.sampling.primitives import MAX_STABILITY
from dgemma.sampling.steps import SAMPLER_STEPS

__all__ = ["MAX_STABILITY", "SAMPLER_STEPS", "RunOptions", "SamplingParams", "parse_tiling"]


@dataclass(frozen=True)
class SamplingParams:
    """Per-request sampling settings; the defaults are transformers' DiffusionGemma defaults."""

    max_denoising_steps: int = 48
    t_min: float = 0.4
    t_max: float = 0.8
    entropy_bound: float = 0.1
    confidence_threshold: float = 0.005
    stability_threshold: int = 1
    greedy: bool = False
    seed: int = 0

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise ValueError with one clear line for any setting out of range."""
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, float) and not math.isfinite(value):
                raise ValueError(f"{f.name} must be a finite number, got {value}")
        _require_int(self, "max_denoising_steps", minimum=1)
        _require_int(self, "stability_threshold", minimum=0, maximum=MAX_STABILITY)
        _require_int(self, "seed", minimum=0, maximum=2**63 - 1)
        if not isinstance(self.greedy, bool):
            raise ValueError(f"greedy must be true or false, got {self.greedy!r}")
        for name in ("t_min", "t_max", "entropy_bound", "confidence_threshold"):
            if not isinstance(getattr(self, name), (int, float)) or isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be a number, got {getattr(self, name)!r}")
        if self.t_min <= 0:
            raise ValueError(f"t_min must be > 0, got {self.t_min}")
        if self.t_max < self.t_min:
            raise ValueError(f"t_max must be >= t_min, got t_max={self.t_max} < t_min={self.t_min}")
        if self.entropy_bound <= 0:
            raise ValueError(f"entropy_bound must be > 0, got {self.entropy_bound}")
        if self.confidence_threshold <= 0:
            raise ValueError(f"confidence_threshold must be > 0, got {self.confidence_threshold}")

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


def _require_int(params: SamplingParams, name: str, minimum: int, maximum: int | None = None) -> None:
    value = getattr(params, name)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if value < minimum or (maximum is not None and value > maximum):
        upper = f" and <= {maximum}" if maximum is not None else ""
        raise ValueError(f"{name} must be >= {minimum}{upper}, got {value}")


def parse_tiling(tiling: str | int) -> str | int:
    """'auto' | 'off' | a positive int (or its string) -> the sampler's tiling mode."""
    if isinstance(tiling, bool):
        raise ValueError(f"tiling must be auto, off or a positive integer, got {tiling!r}")
    if isinstance(tiling, int):
        if tiling < 1:
            raise ValueError(f"tiling must be auto, off or a positive integer, got {tiling}")
        return tiling
    text = str(tiling).strip().lower()
    if text in ("auto", "off"):
        return text
    if text.isdigit() and int(text) >= 1:
        return int(text)
    raise ValueError(f"tiling must be auto, off or a positive integer, got {tiling!r}")


@dataclass(frozen=True)
class RunOptions:
    """How a run is laid out in memory; never changes its tokens.

    tiling: "auto" (the planner sizes tiles from free memory), "off" (one tile: the lesson's
    out-of-memory) or N requests per tile. sampler: the step implementation. memory_budget:
    bytes, or None for the device's own free memory.
    """

    tiling: str | int = "auto"
    sampler: str = "reference"
    memory_budget: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "tiling", parse_tiling(self.tiling))
        if self.sampler not in SAMPLER_STEPS:
            raise ValueError(f"sampler must be one of {', '.join(SAMPLER_STEPS)}, got {self.sampler!r}")
        budget = self.memory_budget
        if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int) or budget < 1):
            raise ValueError(f"memory_budget must be a number of bytes >= 1, got {budget!r}")
