"""The sampler: one denoising step over many requests' canvases, tiled against free memory."""

from dgemma.sampling.params import (
    MAX_SEED, MAX_STABILITY, SAMPLER_STEPS, Bound, RunOptions, SamplingParams, check_number, parse_tiling,
)  # fmt: skip
from dgemma.sampling.sampler import LMHead, StepOutput, TiledSampler, build_sampler

__all__ = [
    "MAX_SEED", "MAX_STABILITY", "SAMPLER_STEPS", "Bound", "LMHead", "RunOptions", "SamplingParams", "StepOutput",
    "TiledSampler", "build_sampler", "check_number", "parse_tiling",
]  # fmt: skip
