"""The schedulers, diffusers' way: one file each, its parameters (a `SchedulerParams` that
`SamplingParams.scheduler` holds), the kind of row it costs and its phases 4-6 (docs/design.md, the
schedulers); picked by name from `SCHEDULER_TABLE`. A new scheduler is a file and a row here.

The stopping rule is every scheduler's (`base.stop_test`), once per predictor step; a row of a
planned scheduler (block refinement, DDIM) that stops commits the argmax of that step's raw logits,
one that reaches its last predictor step commits its canvas. Torch-free on import (base.py says why).
"""

from __future__ import annotations

from dgemma.sampling.schedulers.base import DenoisingScheduler, Phase, SchedulerParams
from dgemma.sampling.schedulers.block_refinement import BlockRefinement
from dgemma.sampling.schedulers.discrete_ddim import DiscreteDDIM
from dgemma.sampling.schedulers.entropy_bound import EntropyBound

# The schedulers by name (diffusers 0.42.1's three for Diffusion-Gemma), in the settings' order.
SCHEDULER_TABLE: dict[str, DenoisingScheduler] = {
    "entropy_bound": EntropyBound(),
    "block_refinement": BlockRefinement(),
    "discrete_ddim": DiscreteDDIM(),
}
SCHEDULERS = tuple(SCHEDULER_TABLE)  # the setting `scheduler`'s choices


def scheduler_for(params: SamplingParams) -> DenoisingScheduler:
    return SCHEDULER_TABLE[params.scheduler.name]


def scheduler_defaults(name: str) -> SchedulerParams:
    """The scheduler `name`'s parameters at their defaults (`name` a key of SCHEDULER_TABLE)."""
    return SCHEDULER_TABLE[name].Params()


def budget(params: SamplingParams) -> tuple[int, int]:
    """(predictor steps, predictor steps followed by corrector sweeps) of a canvas: diffusers folds
    the sweeps into `max_denoising_steps` forwards, the first `corrected` steps taking
    `corrector_steps` sweeps each, so the forwards stay within the budget."""
    total, sweeps = params.max_denoising_steps, scheduler_for(params).sweeps(params)
    if sweeps == 0:
        return total, 0
    corrected = (total - 1) // (1 + sweeps)
    return total - corrected * sweeps, corrected


def phase(params: SamplingParams, forward: int) -> Phase:
    """The phase of a canvas's `forward`-th decoder forward (0-based)."""
    steps, corrected = budget(params)
    period = 1 + scheduler_for(params).sweeps(params)
    if forward < corrected * period:
        return Phase(forward // period, steps, forward % period)
    return Phase(corrected + forward - corrected * period, steps)
