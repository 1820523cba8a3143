"""Where a checkpoint comes from: the embedded default, a local directory, or a hub id.

Torch-free on purpose: `python app.py` checks the --model argument before it serves its page,
and the page is served before torch has loaded (dgemma/model/loading.py re-exports these names).
"""

from __future__ import annotations

import re
from pathlib import Path

DEFAULT_MODEL = str(Path(__file__).resolve().parents[2] / "assets" / "model")
"""The small DiffusionGemma this project trains and ships (dgemma/embedded/train.py writes it)."""

HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def is_embedded(name: str | None) -> bool:
    """Whether `name` (None: the default) is the embedded model this project ships."""
    return name is None or Path(name).expanduser().resolve() == Path(DEFAULT_MODEL)


def public_name(name: str | None) -> str:
    """The model as a public page may name it: "embedded", a hub id as given, or a local checkpoint's
    directory name. Never the server's absolute path: `/info` and run files are public."""
    if is_embedded(name):
        return "embedded"
    path = Path(str(name)).expanduser()
    return path.resolve().name if path.is_dir() else str(name)


class ModelLoadError(RuntimeError):
    """A checkpoint could not be loaded; the message is one sentence meant for the user."""


def resolve_source(name: str | None) -> tuple[str, bool]:
    """Return (path or hub id, is_local). Raise ModelLoadError for something that is neither."""
    name = DEFAULT_MODEL if name is None else str(name)
    if not name.strip():
        raise ModelLoadError("empty model path")
    path = Path(name).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelLoadError(f"{name} is a directory but holds no config.json: not a checkpoint")
        return str(path), True
    if path.exists():
        raise ModelLoadError(f"{name} is a file, not a checkpoint directory")
    if name == DEFAULT_MODEL:
        raise ModelLoadError(
            f"the embedded model is missing at {name}; train it with `python -m dgemma.embedded.train` or pass --model"
        )
    if name.startswith((".", "/", "~")) or name.count("/") != 1 or not HUB_ID.match(name):
        raise ModelLoadError(f"model path not found: {name}")
    return name, False
