"""The sampler: one denoising step over many requests' canvases, tiled against free memory."""

from typing import TYPE_CHECKING

from dgemma.sampling.params import MAX_STABILITY, SAMPLER_STEPS, RunOptions, SamplingParams, parse_tiling

if TYPE_CHECKING:
    from dgemma.sampling.sampler import LMHead, StepOutput, TiledSampler, build_sampler

__all__ = [
    "MAX_STABILITY", "SAMPLER_STEPS", "LMHead", "RunOptions", "SamplingParams", "StepOutput", "TiledSampler",
    "build_sampler", "parse_tiling",
]  # fmt: skip

_SAMPLER_NAMES = {"LMHead", "StepOutput", "TiledSampler", "build_sampler"}


def __getattr__(name: str) -> object:
    # The sampler's names import torch on first use: the settings (and so the page, served before
    # the model loads) need only params.py, and torch takes seconds to import.
    if name in _SAMPLER_NAMES:
        from dgemma.sampling import sampler

        return getattr(sampler, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
