"""Discrete DDIM (diffusers 0.42.1's; its arithmetic in sampling/ddim.py): every position takes one
of three routes of the uniform corruption's posterior q(x_s | x_t, x0) (clean: the proposed token;
stay: its current token; noise: a keyed token), drawn from a keyed uniform. Its corrector sweeps
(`corrector_steps`) are decoder forwards of their own, folded into the denoising budget as diffusers
does (`schedulers.phase`): a sweep picks `corrector_k` positions by Gumbel-top-k over the
leave-one-out conditional's confidence and resamples them from it (keyed), in float64.

It reads the RAW distribution, as block refinement does (`temperature` > 0: its proposals drawn
from softmax(logits / T)); a row that reaches its last predictor step commits the clean route
everywhere."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from dgemma.sampling.bounds import Bound
from dgemma.sampling.schedulers.base import Offered, PlannedScheduler, SchedulerParams

# How the corrector picks the positions it resamples (diffusers' `corrector_selection`).
CORRECTOR_SELECTIONS = ("lowest_log_margin", "lowest_maxprob", "lowest_current_prob", "random")


@dataclass(frozen=True)
class DiscreteDDIMParams(SchedulerParams):
    """temperature: the sample's (0: argmax); the corrector_* options are diffusers' names."""

    name: str = field(default="discrete_ddim", init=False)
    temperature: float = 0.0
    corrector_steps: int = 0
    corrector_k: int = 1
    corrector_selection: str = "lowest_log_margin"
    corrector_selection_tau: float = 1.0
    BOUNDS = {"temperature": Bound(float, 0.0, 10.0), "corrector_steps": Bound(int, 0, 64),
              "corrector_k": Bound(int, 1, 4096), "corrector_selection_tau": Bound(float, 0.0, math.inf, above=True)}
    CHOICES = {"corrector_selection": CORRECTOR_SELECTIONS}


class DiscreteDDIM(PlannedScheduler):
    Params = DiscreteDDIMParams

    def sweeps(self, params: SamplingParams) -> int:
        return params.scheduler.corrector_steps

    def advance(self, inputs: TileInputs, offered: Offered) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        from dgemma.sampling.ddim import discrete_ddim

        next_canvas, clean = discrete_ddim(offered.proposed, inputs.canvas, offered.renoise, inputs.rows, inputs.phases,
                                           offered.vocab_size, inputs.pins)  # fmt: skip
        return next_canvas, clean, inputs.committed
