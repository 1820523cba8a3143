"""The app's backend keeps one engine per loaded model: Generate (any tiling, either step) and the lesson's runs share it."""

from __future__ import annotations

from dgemma.serving.backend import read_run

import argparse
import threading
from pathlib import Path

import pytest

from dgemma.model.loading import DEFAULT_MODEL

pytestmark = pytest.mark.embedded  # the app's backend on the shipped model


def engine_threads() -> set[int]:
    return {t.ident for t in threading.enumerate() if t.name == "dgemma-engine"}


OTHERS: set[int] = set()  # engine threads of other tests in this process, alive before the backend


@pytest.fixture
def backend():
    from dgemma.serving.engine_backend import make_backend

    if not (Path(DEFAULT_MODEL) / "config.json").is_file():
        pytest.skip("the embedded model is not in assets/model yet")
    args = argparse.Namespace(model=DEFAULT_MODEL, device="cpu", memory_budget=None, max_num_seqs=8,
                              max_prompts=8, max_new_tokens=32, max_queued=8)
    OTHERS.clear()
    OTHERS.update(engine_threads())
    backend = make_backend(args)
    yield backend
    backend.close()


def test_generate_with_every_layout_and_the_lesson_run_on_one_engine_thread(backend):
    from dgemma.sampling import RunOptions, SamplingParams
    from dgemma.serving.runs import RunService
    from dgemma.settings import RunRequest, Settings
    from dgemma.ui.lesson.tab import run_lesson

    prompts = ["add 12+34", "count 3 to 9"]
    texts = {}
    for tiling in ("auto", "off"):
        for sampler in ("reference", "chunked"):
            run = backend.start(RunRequest(tuple(prompts), Settings(SamplingParams(seed=3), RunOptions(tiling=tiling, sampler=sampler), max_new_tokens=16)))
            progress = read_run(run)
            outputs, plans = progress.outputs(), progress.plans
            run.close()
            assert not any(o.error for o in outputs) and plans
            assert {p.impl for p in plans} == {sampler}
            texts[tiling, sampler] = [o.text for o in outputs]
    runs = {}
    for _ in run_lesson(RunService(backend), None, 4, backend.suggest_budget(4, False), False, 4, runs):
        pass
    assert not runs["untiled"].ok and runs["tiled"].ok and len(runs["tiled"].tokens) == 4
    assert len(set(map(tuple, texts.values()))) == 1  # the layout never changes the tokens
    assert len(engine_threads() - OTHERS) == 1


def test_a_run_with_its_own_memory_budget_plans_against_it(backend):
    from dgemma.sampling import RunOptions
    from dgemma.settings import RunRequest, Settings

    run = backend.start(RunRequest(("add 1+2", "add 3+4", "add 5+6"), Settings(options=RunOptions(memory_budget=64 * 2**20), max_new_tokens=16)))
    progress = read_run(run)
    outputs, plans = progress.outputs(), progress.plans
    run.close()
    assert not any(o.error for o in outputs)
    assert plans and all(p.budget_bytes == 64 * 2**20 for p in plans)
