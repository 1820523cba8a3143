"""What every front end says about a failure: a setting's one sentence, an error's first line, a
problem written as a sentence."""

from __future__ import annotations


class SettingsError(ValueError):
    """One clear sentence about what is wrong with a setting or a prompt (the UI and API show it as is)."""


def first_line(err: BaseException, limit: int | None = None) -> str:
    """The first non-empty line of an error's message (at most `limit` characters); its type's name if it has none."""
    lines = str(err).strip().splitlines()
    text = lines[0] if lines else type(err).__name__
    return text[:limit] if limit is not None else text


def sentence(problem: str) -> str:
    """A problem as the one sentence a person reads: capitalised, one full stop."""
    return f"{problem[:1].upper()}{problem[1:].rstrip('.')}."
