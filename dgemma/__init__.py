"""dgemma: watch a Diffusion-Gemma model sample, and see why request tiling keeps it in memory.

Data flows one way: UI -> engine -> sampler -> events -> UI.
"""

from dgemma.reproducible import ask_mkl_for_strict_reproducibility

__version__ = "0.1.0"

# Before any matrix product of the process (MKL reads it once): a request's rows get the same
# bits whatever its batch-mates and tile (dgemma/reproducible.py).
ask_mkl_for_strict_reproducibility()
