"""The engine's three schedulers give diffusers 0.42.1's tokens and step counts on the embedded model.

diffusers' `DiffusionGemmaPipeline` runs with each scheduler, drawing the engine's keyed noise
(tests/diffusers_noise.py), on 30 held-out prompts, with the scheduler's defaults and one other
setting. Prompts run one per pipeline call: diffusers' step count is its batch's (a canvas's loop
runs until every row has stopped), and rows of different lengths would be padded, which moves
their positions; the engine's tokens and steps are per request whatever its batch.

Where the two differ by design: a canvas that reaches the entropy bound's last allowed step commits
the engine's argmax draft (as transformers' `generate`, tests/test_canvas_start.py) but diffusers'
re-noised canvas (its loop simply ends). There tokens are compared up to that canvas, steps in full,
and the prompts are counted. Block refinement and DDIM commit the same canvas at their last step.
"""

from __future__ import annotations

import pytest
import torch

from dgemma.embedded import corpus
from dgemma.engine import Engine, EngineConfig
from dgemma.events import RequestEvent
from dgemma.sampling import SamplingParams
from dgemma.sampling.schedulers.block_refinement import BlockRefinementParams
from dgemma.sampling.schedulers.discrete_ddim import DiscreteDDIMParams
from compare_runs import until_eos
diffusers = pytest.importorskip("diffusers")  # it needs Python 3.11: not installed on 3.10

from diffusers_noise import PromptProcessor, keyed_pipeline  # noqa: E402
from diffusers import BlockRefinementScheduler, DiffusionGemmaPipeline, DiscreteDDIMScheduler, EntropyBoundScheduler  # noqa: E402

MAX_NEW_TOKENS = 32  # two canvases: the second starts from the first's commit
STEPS = 32
PROMPTS = [ex.prompt for family in corpus.FAMILIES for ex in corpus.heldout(family, 5)][:30]

# (our settings, diffusers' scheduler): each scheduler's defaults and one setting other than them
CASES = {
    "entropy_bound": (dict(greedy=True), EntropyBoundScheduler(num_inference_steps=STEPS)),
    "entropy_bound-bound-0.5": (dict(greedy=True, entropy_bound=0.5), EntropyBoundScheduler(entropy_bound=0.5)),
    "block_refinement": (dict(scheduler=BlockRefinementParams()), BlockRefinementScheduler()),
    "block_refinement-editing-0.9": (dict(scheduler=BlockRefinementParams(editing_threshold=0.9)),
                                     BlockRefinementScheduler(editing_threshold=0.9)),
    "discrete_ddim": (dict(scheduler=DiscreteDDIMParams()), DiscreteDDIMScheduler()),
    "discrete_ddim-corrector-1": (dict(scheduler=DiscreteDDIMParams(corrector_steps=1)), DiscreteDDIMScheduler(corrector_steps=1)),
}  # fmt: skip


@pytest.fixture(scope="module")
def engine(embedded_model):
    # One thread: the embedded model's products are too small to share, and on a shared machine's
    # two cores a second thread waits more than it works (ten times slower in hand timings).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with Engine(embedded_model, EngineConfig(max_num_seqs=16)) as eng:
            yield eng
    finally:
        torch.set_num_threads(threads)


def engine_runs(engine, model, settings: dict) -> list[tuple[list[int], list[int]]]:
    """Each prompt's tokens and predictor steps per canvas, all prompts submitted at once (a crowd)."""
    handles = [engine.submit(p, SamplingParams.from_generation_config(model.generation_config, seed=seed, **settings),
                             MAX_NEW_TOKENS) for seed, p in enumerate(PROMPTS)]  # fmt: skip
    runs = []
    for handle in handles:
        events = list(handle.events(timeout=300))
        final = handle.result(300)
        commits = [e for e in events if isinstance(e, RequestEvent) and e.status == "committed"] + [final]
        totals = [e.extra["predictor_steps"] for e in commits]
        runs.append((list(final.token_ids), [b - a for a, b in zip([0, *totals], totals)]))
    return runs


@pytest.mark.parametrize("case", CASES)
def test_the_engine_gives_diffusers_tokens_and_steps(engine, embedded_model, case):
    settings, scheduler = CASES[case]
    model, eos = embedded_model.model, embedded_model.model.generation_config.eos_token_id
    pipe = DiffusionGemmaPipeline(model=model, scheduler=scheduler, processor=PromptProcessor(embedded_model))
    pipe.set_progress_bar_config(disable=True)
    ours = engine_runs(engine, model, settings)
    tokens_equal = steps_equal = at_limit = 0
    canvas = embedded_model.canvas_length
    for seed, (prompt, (tokens, steps)) in enumerate(zip(PROMPTS, ours)):
        theirs = keyed_pipeline(pipe, [prompt], [seed], MAX_NEW_TOKENS, num_inference_steps=STEPS)
        their_tokens = until_eos(theirs.new_tokens[0], eos)[:MAX_NEW_TOKENS]
        if case.startswith("entropy_bound") and STEPS in steps:  # compared up to the canvas that reached it
            at_limit += 1
            tokens, their_tokens = (t[: steps.index(STEPS) * canvas] for t in (tokens, their_tokens))
        tokens_equal += tokens == their_tokens
        steps_equal += steps == theirs.canvas_steps[: len(steps)]
    print(f"{case}: {tokens_equal}/{len(PROMPTS)} prompts equal, {steps_equal}/{len(PROMPTS)} step counts equal, "
          f"{at_limit} reached the entropy bound's last step")
    assert (tokens_equal, steps_equal) == (len(PROMPTS), len(PROMPTS))


@pytest.mark.parametrize("case", ["block_refinement", "discrete_ddim-corrector-1"])
def test_the_chunked_step_gives_the_reference_tokens_and_steps_on_the_embedded_model(engine, embedded_model, case):
    settings = CASES[case][0]
    with Engine(embedded_model, EngineConfig(max_num_seqs=16, sampler="chunked")) as chunked:
        assert engine_runs(chunked, embedded_model.model, settings) == engine_runs(engine, embedded_model.model, settings)
