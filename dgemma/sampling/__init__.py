"""The sampler: one denoising step over many requests' canvases, tiled against free memory."""

from dgemma.sampling.params import MAX_STABILITY, SAMPLER_STEPS, RunOptions, SamplingParams, parse_tiling
from dgemma.sampling.sampler import LMHead, StepOutput, TiledSampler, build_sampler

__all__ = [
    "MAX_STABILITY", "SAMPLER_STEPS", "LMHead", "RunOptions", "SamplingParams", "StepOutput", "TiledSampler",
    "build_sampler", "parse_tiling",
]  # fmt: skip
