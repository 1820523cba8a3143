"""Package attributes that import their module on first use (PEP 562).

The page is served before torch has loaded: `dgemma.memory` and `dgemma.sampling` keep their
plain-Python names eager and load the rest, which imports torch, only when first asked for.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable


def lazy_attributes(package: str, modules: dict[str, str]) -> Callable[[str], object]:
    """A module `__getattr__` for `package`: name -> the submodule (of `package`) that defines it."""

    def __getattr__(name: str) -> object:
        if name in modules:
            return getattr(importlib.import_module(f"{package}.{modules[name]}"), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
