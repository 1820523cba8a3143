"""Settings from the UI or the API, checked once, with one clear sentence per mistake.

Names and meanings are the CLI's (`python -m dgemma.generate`), so the same settings give the
same tokens through the API, the CLI and the UI. `seed` S gives the i-th prompt the seed S + i.
Anything wrong raises `SettingsError` (a ValueError) whose message is one sentence a person can
act on; the UI and the API turn it into a `gr.Error`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from typing import Any

from dgemma.sampling import SamplingParams


class SettingsError(ValueError):
    """One clear sentence about what is wrong with the input."""


@dataclass(frozen=True)
class Limits:
    """What one call or one session may ask for, so that one client cannot starve the others."""

    max_prompts: int = 64  # prompts in one call (after filling up to `concurrent`)
    max_new_tokens: int = 256
    max_queued: int = 64  # requests one session may have waiting or running at once
    max_prompt_chars: int = 4000


_SAMPLING = SamplingParams()  # the sampling defaults live in one place: the sampler's


@dataclass(frozen=True)
class Settings:
    max_new_tokens: int = 32
    max_denoising_steps: int = _SAMPLING.max_denoising_steps
    t_min: float = _SAMPLING.t_min
    t_max: float = _SAMPLING.t_max
    entropy_bound: float = _SAMPLING.entropy_bound
    confidence_threshold: float = _SAMPLING.confidence_threshold
    stability_threshold: int = _SAMPLING.stability_threshold
    seed: int = _SAMPLING.seed
    greedy: bool = _SAMPLING.greedy
    tiling: str = "auto"  # auto | off | N (requests per tile)
    memory_budget: str | None = None  # e.g. "512MiB"; None = the server's --memory-budget
    sampler: str = "reference"  # reference (eager, ~2 fp32 vocab copies per request) | chunked (streams the vocab)


# name -> (kind, low, high): inclusive bounds that keep a run sane on a laptop and a Space.
_RULES: dict[str, tuple[type, float, float]] = {
    "max_new_tokens": (int, 1, math.inf),  # the upper bound comes from Limits
    "max_denoising_steps": (int, 1, 512),
    "t_min": (float, 1e-3, 10.0),
    "t_max": (float, 1e-3, 10.0),
    "entropy_bound": (float, 0.0, 1e6),
    "confidence_threshold": (float, 0.0, 1e6),
    "stability_threshold": (int, 0, 512),
    "seed": (int, 0, 2**62),
}
NAMES = tuple(f.name for f in fields(Settings))


def _number(name: str, value: Any, kind: type, low: float, high: float) -> int | float:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise SettingsError(f"Setting '{name}' must be a number, got {type(value).__name__}.")
    try:
        number = float(value)
    except ValueError:
        raise SettingsError(f"Setting '{name}' must be a number, got {str(value)[:40]!r}.") from None
    if not math.isfinite(number):
        raise SettingsError(f"Setting '{name}' must be a finite number, got {value!r}.")
    if kind is int:
        if number != int(number):
            raise SettingsError(f"Setting '{name}' must be a whole number, got {value!r}.")
        number = int(number)
    if not low <= number <= high:
        top = "" if math.isinf(high) else f" and {high:g}"
        raise SettingsError(f"Setting '{name}' must be between {low:g}{top}, got {value!r}." if top
                            else f"Setting '{name}' must be at least {low:g}, got {value!r}.")
    return number


def _bool(name: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in ("true", "false", "1", "0", "yes", "no"):
        return value.strip().lower() in ("true", "1", "yes")
    raise SettingsError(f"Setting '{name}' must be true or false, got {str(value)[:40]!r}.")


def _tiling(value: Any, max_num_seqs: int) -> str:
    text = str(value).strip().lower() if isinstance(value, (str, int)) and not isinstance(value, bool) else None
    if text in ("auto", "off"):
        return text
    if text is not None and text.isdigit() and 1 <= int(text) <= max_num_seqs:
        return str(int(text))
    raise SettingsError(f"Setting 'tiling' must be auto, off, or a tile size from 1 to {max_num_seqs}, got {str(value)[:40]!r}.")


def _budget(value: Any) -> str:
    from dgemma.memory.memory import parse_size  # a size such as 512MiB, the CLI's --memory-budget syntax

    try:
        if isinstance(value, bool) or not isinstance(value, (str, int)):
            raise ValueError
        parse_size(value)
    except ValueError:
        raise SettingsError(f"Setting 'memory_budget' must be a size such as 512MiB or 2GiB, got {str(value)[:40]!r}.") from None
    return str(value).strip()


def parse_settings(raw: dict | None, defaults: Settings, limits: Limits, max_num_seqs: int) -> Settings:
    """Checked settings: `defaults` overridden by `raw` (CLI names; dashes or underscores)."""
    if raw is None:
        return defaults
    if not isinstance(raw, dict):
        raise SettingsError(f"Settings must be an object of name: value pairs, got {type(raw).__name__}.")
    values: dict[str, Any] = {}
    for key, value in raw.items():
        name = str(key).replace("-", "_")
        if name not in NAMES:
            raise SettingsError(f"Unknown setting {str(key)[:40]!r}; known settings: {', '.join(NAMES)}.")
        if value is None:
            continue  # null means "the default", as an omitted key does
        if name == "greedy":
            values[name] = _bool(name, value)
        elif name == "tiling":
            values[name] = _tiling(value, max_num_seqs)
        elif name == "memory_budget":
            values[name] = _budget(value)
        elif name == "sampler":
            if value not in ("reference", "chunked"):
                raise SettingsError(f"Setting 'sampler' must be reference or chunked, got {str(value)[:40]!r}.")
            values[name] = value
        else:
            kind, low, high = _RULES[name]
            if name == "max_new_tokens":
                high = limits.max_new_tokens
            values[name] = _number(name, value, kind, low, high)
    settings = replace(defaults, **values)
    if settings.t_max < settings.t_min:
        raise SettingsError(f"Setting 't_max' ({settings.t_max:g}) must not be below 't_min' ({settings.t_min:g}).")
    return settings


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


def prompts_from_text(text: str, concurrent: int) -> list[str]:
    """The UI's textbox: one prompt per non-empty line, cycled to fill `concurrent` requests."""
    lines = [line for line in (text or "").splitlines() if line.strip()]
    if not lines:
        return []
    n = max(len(lines), int(concurrent or 0))
    return [lines[i % len(lines)] for i in range(n)]
