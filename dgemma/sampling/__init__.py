"""The sampler: one denoising step over many requests' canvases, tiled against free memory.

params (what a request asks, how a run is laid out), keyed (keyed randomness), primitives (the
step's shared pieces), reference / chunked (the step implementations, by name in steps), seed
(the seed's step, a baseline), calibration (memory on meta tensors), tiled (the slot state and
the tiling loop).
"""

from dgemma.sampling.calibration import calibrate_tile, meta_tile_inputs
from dgemma.sampling.chunked import chunked_tile
from dgemma.sampling.keyed import RowKey
from dgemma.sampling.params import MAX_STABILITY, SAMPLER_STEPS, RunOptions, SamplingParams, parse_tiling
from dgemma.sampling.primitives import LMHead, Scores, TileInputs, TileResult
from dgemma.sampling.reference import reference_tile
from dgemma.sampling.seed import seed_tile
from dgemma.sampling.tiled import StepOutput, TiledSampler, build_sampler

__all__ = [
    "MAX_STABILITY", "SAMPLER_STEPS", "LMHead", "RowKey", "RunOptions", "SamplingParams", "Scores", "StepOutput",
    "TileInputs", "TileResult", "TiledSampler", "build_sampler", "calibrate_tile", "chunked_tile", "meta_tile_inputs",
    "parse_tiling", "reference_tile", "seed_tile",
]  # fmt: skip
