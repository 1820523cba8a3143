"""The sampler: one denoising step over many requests' canvases, tiled against free memory.

params (what a request asks, how a run is laid out), keyed (keyed randomness), primitives (the
step's shared pieces), blocks (the softmax in vocab blocks and the sample's block race),
reference / chunked (the step implementations, by name in steps, with the config a sampler is
built from), schedulers/ (one file per scheduler: its parameters, the kind of row it costs and its
phases 4-6; discrete DDIM's arithmetic in ddim), bounds (a setting's checks), seed (the seed's
step, a baseline), calibration (memory on meta tensors), tiled (the slot state and the tiling loop).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dgemma import lazy_attributes

from dgemma.sampling.bounds import Bound, check_number
from dgemma.sampling.params import MAX_SEED, MAX_STABILITY, SAMPLER_STEPS, RunOptions, SamplingParams, parse_tiling
from dgemma.sampling.schedulers import SCHEDULERS

if TYPE_CHECKING:
    from dgemma.sampling.calibration import calibrate_tile
    from dgemma.sampling.chunked import chunked_tile
    from dgemma.sampling.keyed import RowKey
    from dgemma.sampling.primitives import LMHead, Scores, TileInputs, TileResult
    from dgemma.sampling.reference import reference_tile
    from dgemma.sampling.seed import seed_tile
    from dgemma.sampling.budget import calibration_for, call_ledger
    from dgemma.sampling.steps import SamplerConfig
    from dgemma.sampling.tiled import StepOutput, TiledSampler

# The step's names import torch on first use: the settings (and so the page, served before the
# model loads) need only params.py, and torch takes seconds to import.
_LAZY = {
    "calibrate_tile": "calibration", "chunked_tile": "chunked", "RowKey": "keyed", "LMHead": "primitives",
    "Scores": "primitives", "TileInputs": "primitives", "TileResult": "primitives", "reference_tile": "reference",
    "seed_tile": "seed", "SamplerConfig": "steps", "calibration_for": "budget", "call_ledger": "budget",
    "StepOutput": "tiled", "TiledSampler": "tiled",
}  # fmt: skip
__all__ = ["MAX_SEED", "MAX_STABILITY", "SAMPLER_STEPS", "SCHEDULERS", "Bound", "RunOptions", "SamplingParams", "check_number",
           "parse_tiling", *_LAZY]

__getattr__ = lazy_attributes(__name__, _LAZY)
