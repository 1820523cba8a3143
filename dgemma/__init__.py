"""dgemma: watch a Diffusion-Gemma model sample, and see why request tiling keeps it in memory.

Data flows one way: UI -> engine -> sampler -> events -> UI.
"""

import importlib
from collections.abc import Callable

from dgemma.reproducible import ask_mkl_for_strict_reproducibility

__version__ = "0.1.0"

# Before any matrix product of the process (MKL reads it once): a request's rows get the same
# bits whatever its batch-mates and tile (dgemma/reproducible.py).
ask_mkl_for_strict_reproducibility()


# Package attributes that import their module on first use (PEP 562): the page is served before torch has
# loaded, so `dgemma.memory` and `dgemma.sampling` keep their plain-Python names eager and load the rest lazily.
def lazy_attributes(package: str, modules: dict[str, str]) -> Callable[[str], object]:
    """A module `__getattr__` for `package`: name -> the submodule (of `package`) that defines it."""

    def __getattr__(name: str) -> object:
        if name in modules:
            return getattr(importlib.import_module(f"{package}.{modules[name]}"), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
