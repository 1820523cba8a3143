"""The views: what the page draws from the event stream and plain data (never torch or the engine)."""

from pathlib import Path


def asset(name: str) -> str:
    """The text of `name` under assets/: the page's scripts and the board view's template, kept as files."""
    return (Path(__file__).resolve().parents[2] / "assets" / name).read_text(encoding="utf-8")
