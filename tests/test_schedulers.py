"""Block refinement and discrete DDIM in the tiled sampler: each row's tokens are its own, whatever
its tile-mates, the tiling, the step implementation or an out-of-memory split; pins hold."""

from __future__ import annotations

import pytest
import torch

from dgemma.memory import VirtualDevice
from dgemma.sampling import SAMPLER_STEPS, SCHEDULERS, SamplerConfig, SamplingParams, TiledSampler
from dgemma.sampling.schedulers import SCHEDULER_TABLE, DenoisingScheduler, Phase, budget, phase
from dgemma.sampling.schedulers.block_refinement import BlockRefinementParams
from dgemma.sampling.schedulers.discrete_ddim import DiscreteDDIMParams
from dgemma.sampling.steps import STEPS as STEP_TABLE
from dgemma.sampling.start import CanvasStart
from dgemma.settings import Settings, parse_settings
from compare_runs import assert_same, logits_for

HIDDEN, CL, V, STEPS = 8, 6, 700, 5  # three vocab blocks; the chunked step's chunks cut them

# Rows of every kind, sharing tiles: the entropy bound sampling and greedy, block refinement greedy,
# sampled, editing, DDIM greedy, sampled, with corrector sweeps of each selection.
PARAMS = [
    SamplingParams(seed=1, entropy_bound=0.3, max_denoising_steps=STEPS),
    SamplingParams(seed=2, greedy=True, entropy_bound=0.3, max_denoising_steps=STEPS),
    SamplingParams(seed=3, scheduler=BlockRefinementParams(), max_denoising_steps=STEPS),
    SamplingParams(seed=4, scheduler=BlockRefinementParams(temperature=0.8, editing_threshold=0.0, commit_threshold=0.5),
                   max_denoising_steps=STEPS),
    SamplingParams(seed=5, scheduler=DiscreteDDIMParams(), max_denoising_steps=STEPS),
    SamplingParams(seed=6, scheduler=DiscreteDDIMParams(temperature=1.2), max_denoising_steps=STEPS),
    SamplingParams(seed=7, scheduler=DiscreteDDIMParams(corrector_steps=1, corrector_k=2), max_denoising_steps=STEPS),
    SamplingParams(seed=8, scheduler=DiscreteDDIMParams(corrector_steps=1, corrector_selection="random"),
                   max_denoising_steps=STEPS),
    SamplingParams(seed=9, scheduler=DiscreteDDIMParams(corrector_steps=1, corrector_selection="lowest_maxprob",
                   corrector_selection_tau=0.5), max_denoising_steps=STEPS),
    SamplingParams(seed=10, scheduler=DiscreteDDIMParams(corrector_steps=1, corrector_selection="lowest_current_prob"),
                   max_denoising_steps=STEPS),
]  # fmt: skip
SPLITTING_BUDGET = 200_000  # bytes: a tile of every row runs out of memory, one of a few fits
FIELDS = ("canvas", "draft", "committed", "out_accepted", "out_converged")


def embed() -> torch.Tensor:
    return torch.randn(V, HIDDEN, generator=torch.Generator().manual_seed(11)) * HIDDEN**-0.5


def logits_of(params: list[SamplingParams], step: int) -> torch.Tensor:
    """Each request's logits depend on its own seed and the step only (as a model's on its own canvas)."""
    return torch.cat([logits_for(1, CL, V, p.seed * 100 + step, scale=4) for p in params])


def run(params: list[SamplingParams], impl: str = "reference", tiling="off", memory=None, starts=None, chunk_size=300):
    """Every step's per-slot state and outputs, per request, over STEPS forwards."""
    sampler = TiledSampler(SamplerConfig(len(params), CL, V, embed(), 2.0, memory=memory, tiling=tiling, impl=impl,
                                         chunk_size=chunk_size if impl == "chunked" else None))  # fmt: skip
    for slot, p in enumerate(params):
        sampler.start_canvas(slot, p, 0, (starts or {}).get(slot))
    slots, idx = list(range(len(params))), torch.arange(len(params))
    steps = []
    for step in range(STEPS):
        plan = sampler.step(logits_of(params, step), slots).plan
        steps.append({name: getattr(sampler, name)[idx].clone() for name in FIELDS} | {"splits": len(plan.splits)})
    return steps


def test_each_scheduler_is_a_class_of_its_own_in_the_table_the_settings_name():
    assert tuple(SCHEDULER_TABLE) == SCHEDULERS  # the settings' torch-free list, in the table's order
    classes = [type(s) for s in SCHEDULER_TABLE.values()]
    assert len(set(classes)) == len(classes) and all(issubclass(c, DenoisingScheduler) for c in classes)
    assert tuple(STEP_TABLE) == SAMPLER_STEPS  # the step implementations' table, likewise


def test_the_plan_folds_corrector_sweeps_into_the_forwards_as_diffusers_does():
    params = SamplingParams(scheduler=DiscreteDDIMParams(corrector_steps=1), max_denoising_steps=32)
    assert budget(params) == (17, 15)  # corrected = (32 - 1) // 2, predictor = 32 - 15
    phases = [phase(params, f) for f in range(32)]
    assert phases[:3] == [Phase(0, 17), Phase(0, 17, 1), Phase(1, 17)]
    assert sum(p.sweep == 0 for p in phases) == 17 and phases[-1] == Phase(16, 17) and phases[-1].last
    given = parse_settings({"scheduler": "block_refinement", "corrector_steps": 3}, Settings()).params
    assert budget(given) == (48, 0)  # only DDIM sweeps


def test_a_row_gives_the_same_tokens_alone_and_in_a_crowd_of_every_scheduler():
    crowd = run(PARAMS)
    for i, p in enumerate(PARAMS):
        assert_same(crowd, run([p]), rows=[i], keys=FIELDS)


@pytest.mark.parametrize("tiling", [1, 3])
def test_tiled_equals_untiled_for_every_scheduler(tiling):
    assert_same(run(PARAMS), run(PARAMS, tiling=tiling), keys=FIELDS)


def test_the_chunked_step_gives_the_reference_tokens_for_every_scheduler():
    assert_same(run(PARAMS), run(PARAMS, "chunked", tiling=4), keys=FIELDS)


def test_a_tile_that_runs_out_of_memory_is_split_without_a_trace():
    split = run(PARAMS, tiling=len(PARAMS), memory=VirtualDevice(SPLITTING_BUDGET))  # one tile asked: it does not fit
    assert all(state["splits"] > 0 for state in split)
    assert_same(run(PARAMS), split, keys=FIELDS)


def test_block_refinement_commits_an_even_share_each_step_and_the_whole_canvas_at_the_last():
    params = [SamplingParams(seed=3, scheduler=BlockRefinementParams(commit_threshold=1.0), max_denoising_steps=STEPS)]
    steps = run(params)
    committed = [int(s["committed"].sum()) for s in steps]
    assert committed == [-(-(k + 1) * CL // STEPS) for k in range(STEPS)]  # the cumulative quota, nothing above 1.0
    assert bool(steps[-1]["out_converged"][0]) and torch.equal(steps[-1]["draft"], steps[-1]["canvas"])


def test_a_pinned_position_holds_its_token_and_counts_as_committed():
    pins = CanvasStart(pins=((1, 42), (4, 7)))
    params = [p for p in PARAMS if p.scheduler.name != "entropy_bound"]
    steps = run(params, starts={slot: pins for slot in range(len(params))})
    for state in steps:
        assert (state["canvas"][:, 1] == 42).all() and (state["canvas"][:, 4] == 7).all()
        assert (state["draft"][:, 1] == 42).all() and (state["draft"][:, 4] == 7).all()
        assert state["committed"][0, [1, 4]].all()  # block refinement's row


def test_the_committed_canvas_carries_the_log_probabilities_of_its_own_tokens():
    params = [SamplingParams(seed=3, scheduler=BlockRefinementParams(), max_denoising_steps=STEPS)]
    sampler = TiledSampler(SamplerConfig(1, CL, V, embed(), 2.0, tiling="off"))
    sampler.start_canvas(0, params[0], 0)
    for step in range(STEPS):
        logits = logits_of(params, step)
        sampler.step(logits, [0])
    assert bool(sampler.out_converged[0])
    want = torch.log_softmax(logits[0], dim=-1).gather(-1, sampler.draft[0][:, None]).squeeze(-1)
    torch.testing.assert_close(sampler.take_logprobs(0), want, rtol=1e-5, atol=1e-5)


def test_a_corrector_sweep_resamples_k_positions_and_keeps_its_predictors_draft_entropy_and_self_conditioning():
    params = SamplingParams(seed=7, scheduler=DiscreteDDIMParams(corrector_steps=1, corrector_k=2), max_denoising_steps=STEPS)
    sampler = TiledSampler(SamplerConfig(1, CL, V, embed(), 2.0, tiling="off"))
    sampler.start_canvas(0, params, 0)
    sampler.step(logits_of([params], 0), [0])  # the predictor step
    before = {name: getattr(sampler, name)[0].clone() for name in ("canvas", "draft", "soft", "out_entropy")}
    sampler.step(logits_of([params], 1), [0])  # its sweep
    assert sampler.swept(0) and not bool(sampler.out_converged[0])
    assert int((sampler.canvas[0] != before["canvas"]).sum()) <= 2 and int(sampler.out_accepted[0].sum()) == 2
    for name in ("draft", "soft", "out_entropy"):
        assert torch.equal(getattr(sampler, name)[0], before[name]), name
