"""dgemma: watch a Diffusion-Gemma model sample, and see why request tiling keeps it in memory.

Data flows one way: UI -> engine -> sampler -> events -> UI.
"""

__version__ = "0.1.0"
