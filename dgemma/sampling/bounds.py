"""A setting's bounds and the checks that read them, torch-free and below everything that has
settings: the request's (`params.SamplingParams`) and each scheduler's own
(`schedulers.base.SchedulerParams`). A value from the command line ("16"), JSON (16.0) or code (16)
is accepted or refused the same way, with the same sentence (a `SettingsError`, a ValueError)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from dgemma.errors import SettingsError


@dataclass(frozen=True)
class Bound:
    """A numeric setting: its kind and inclusive range (`above`: the low end itself is refused)."""

    kind: type  # int or float
    low: float
    high: float
    above: bool = False


def shown(value: Any) -> str:
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
            raise SettingsError(f"Setting '{name}' must be a number, got {shown(value)}.") from None
    if isinstance(number, float) and not math.isfinite(number):
        raise SettingsError(f"Setting '{name}' must be a finite number, got {shown(value)}.")
    if bound.kind is int:
        if number != int(number):
            raise SettingsError(f"Setting '{name}' must be a whole number, got {shown(value)}.")
        number = int(value) if isinstance(value, int) else int(number)  # ints keep all 64 bits
    if (bound.low < number if bound.above else bound.low <= number) and number <= bound.high:
        return number
    low = _limit(bound.low, bound.kind)
    if math.isinf(bound.high):
        floor = f"greater than {low}" if bound.above else f"at least {low}"
        raise SettingsError(f"Setting '{name}' must be {floor}, got {shown(value)}.")
    high = _limit(bound.high, bound.kind)
    if bound.above:
        raise SettingsError(f"Setting '{name}' must be greater than {low} and at most {high}, got {shown(value)}.")
    raise SettingsError(f"Setting '{name}' must be between {low} and {high}, got {shown(value)}.")


def check_choice(name: str, value: Any, choices: tuple[str, ...]) -> str:
    """One of `choices` (any case, surrounding spaces ignored), or a SettingsError naming them."""
    text = value.strip().lower() if isinstance(value, str) else None
    if text in choices:
        return text
    raise SettingsError(f"Setting '{name}' must be one of {', '.join(choices)}, got {shown(value)}.")


def check_bool(name: str, value: Any) -> bool:
    """true/false, 1/0, yes/no (any case) as a bool, or a SettingsError."""
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in ("true", "false", "1", "0", "yes", "no"):
        return value.strip().lower() in ("true", "1", "yes")
    raise SettingsError(f"Setting '{name}' must be true or false, got {shown(value)}.")


def check_value(name: str, value: Any, default: Any, bound: Bound | None, choices: tuple[str, ...] = ()) -> Any:
    """A field's value checked and normalised by what the field is: a flag (its default is a bool),
    one of `choices`, an optional number (its default None: empty text, "off" and "none" are None
    too, a front end's empty box) or a number within `bound`."""
    if isinstance(default, bool):
        return check_bool(name, value)
    if choices:
        return check_choice(name, value, choices)
    if default is None and (value is None or str(value).strip().lower() in ("", "off", "none")):
        return None
    return check_number(name, value, bound)


def check_typed(name: str, value: Any, default: Any, bound: Bound | None, choices: tuple[str, ...] = ()) -> None:
    """A typed field's value: refused with `check_value`'s sentence where that refuses it, and with a
    TypeError where it is not already what the field holds (text first: the edge parses it,
    dgemma/settings.py), so a type's fields are what their hints say."""
    checked = check_value(name, value, default, bound, choices)
    if checked != value or type(checked) is not type(value) and (type(checked), type(value)) != (float, int):
        raise TypeError(f"{name} must be a {type(checked).__name__}, got {shown(value)} (text is parsed by dgemma/settings.py)")
