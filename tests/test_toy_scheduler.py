"""A fourth scheduler is a file and a table row: one defined here, in tests/, runs through the engine
beside the three of dgemma/sampling/schedulers/, its tokens its own whatever the crowd or the tiling."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
import torch

from dgemma.engine import Engine, EngineConfig
from dgemma.sampling import SamplingParams
from dgemma.sampling.bounds import Bound
from dgemma.sampling.schedulers import SCHEDULER_TABLE
from dgemma.sampling.schedulers.base import Offered, PlannedScheduler, SchedulerParams
from dgemma.sampling.schedulers.block_refinement import BlockRefinementParams
from dgemma.sampling.schedulers.discrete_ddim import DiscreteDDIMParams
from dgemma.sampling.schedulers.entropy_bound import EntropyBoundParams

STEPS = 4  # random weights never converge: every canvas takes max_denoising_steps


@dataclass(frozen=True)
class LeftToRightParams(SchedulerParams):
    """per_step: positions committed each step, left to right."""

    name: str = field(default="left_to_right", init=False)
    per_step: int = 3
    BOUNDS = {"per_step": Bound(int, 1, 4096)}


class LeftToRight(PlannedScheduler):
    """The toy: commits the argmax of the next `per_step` positions from the left each step; the
    positions right of them are re-noised."""

    Params = LeftToRightParams
    advanced: list[int] = []  # rows it stepped, by tile: the engine ran it

    def samples(self, params: SamplingParams) -> bool:
        return False

    def advance(self, inputs, offered: Offered) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        canvas, committed = inputs.canvas, inputs.committed
        step = torch.tensor([p.step for p in inputs.phases], device=canvas.device)
        per_step = torch.tensor([q.scheduler.per_step for q in inputs.params], device=canvas.device)
        after = committed | (torch.arange(canvas.shape[-1], device=canvas.device) < ((step + 1) * per_step)[:, None])
        transfer = after & ~committed
        next_canvas = torch.where(transfer, offered.draft, torch.where(committed, canvas, offered.renoise))
        if inputs.pins is not None:
            next_canvas = torch.where(inputs.pins >= 0, inputs.pins, next_canvas)
        self.advanced.append(len(inputs.rows))
        return next_canvas, transfer, after


@pytest.fixture
def toy(monkeypatch):
    """The fourth scheduler's one table row, for this test only."""
    LeftToRight.advanced = []
    monkeypatch.setitem(SCHEDULER_TABLE, "left_to_right", LeftToRight())
    return LeftToRight


def requests() -> list[tuple[str, SamplingParams]]:
    """The toy's requests among rows of every scheduler."""
    schedulers = [LeftToRightParams(), BlockRefinementParams(temperature=0.7), LeftToRightParams(per_step=5),
                  DiscreteDDIMParams(corrector_steps=1), EntropyBoundParams()]
    return [(f"count {i} to {i + 6}", SamplingParams(max_denoising_steps=STEPS, seed=10 + i, scheduler=s))
            for i, s in enumerate(schedulers)]


def run(loaded, batch: list[tuple[str, SamplingParams]], tiling) -> list[tuple]:
    with Engine(loaded, EngineConfig(max_num_seqs=len(batch), tiling=tiling)) as engine:
        finals = [h.result(120) for h in [engine.submit(p, q, max_new_tokens=24) for p, q in batch]]
    assert all(f.status == "done" for f in finals)
    return [(f.token_ids, f.steps, f.extra["logprobs"]) for f in finals]


def test_a_scheduler_defined_in_tests_runs_through_the_engine(tiny_model, toy):
    prompt, params = requests()[0]
    [(tokens, steps, _)] = run(tiny_model, [(prompt, params)], "off")
    assert tokens and toy.advanced == [1] * steps  # every step of the request was the toy's, one row a tile


def test_the_fourth_scheduler_gives_a_request_the_same_tokens_alone_and_in_a_crowd(tiny_model, toy):
    batch = requests()
    crowd = run(tiny_model, batch, "off")
    for i in (0, 2):  # the toy's requests
        assert run(tiny_model, [batch[i]], "off") == [crowd[i]]


@pytest.mark.parametrize("tiling", [1, 2])
def test_the_fourth_scheduler_gives_the_same_tokens_tiled_and_untiled(tiny_model, toy, tiling):
    batch = requests()
    assert run(tiny_model, batch, tiling) == run(tiny_model, batch, "off")
