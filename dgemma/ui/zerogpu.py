"""Hugging Face ZeroGPU: run GPU work inside `spaces.GPU` when the `spaces` package is present.

On a dedicated GPU Space, or anywhere else, `spaces` is absent and `gpu` returns the function
unchanged, so the app runs as is.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

F = TypeVar("F", bound=Callable)

try:  # pragma: no cover - only on Hugging Face Spaces
    import spaces as _spaces
except ImportError:  # the ordinary case: no ZeroGPU
    _spaces = None


def gpu(fn: F, duration: int = 120) -> F:
    """`spaces.GPU(duration=...)(fn)` on ZeroGPU; `fn` itself everywhere else."""
    if _spaces is None:
        return fn
    return _spaces.GPU(duration=duration)(fn)  # pragma: no cover


def available() -> bool:
    return _spaces is not None
