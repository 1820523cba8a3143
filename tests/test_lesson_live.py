"""The lesson's runs, live: each is an ordinary run of the backend (`Backend.start`), streamed as a
Generate run is, folding into the same board and compact frames (one row per request, one cell
per canvas position); its outcome is read from its events."""

from __future__ import annotations

import html

import pytest

from dgemma.serving.runs import RunService
from dgemma.ui.lesson import tab

N, STEPS = 6, 3


@pytest.fixture(scope="module")
def backend(tiny_model):
    from dgemma.engine import EngineConfig
    from dgemma.serving.engine_backend import EngineBackend
    from dgemma.settings import Limits

    backend = EngineBackend(tiny_model, EngineConfig(max_num_seqs=N), Limits(), None)
    yield backend
    backend.close()


def watched(backend, tiling: str, budget: str | None) -> tuple[list, object]:
    """One lesson run's frames and outcome, as the tab streams it."""
    view = tab.watch(RunService(backend), None, tab.lesson_call(backend, N, STEPS, None, budget, tiling), "a run")
    frames = []
    while True:
        try:
            frames.append(next(view).get("board", {}))  # the board's output
        except StopIteration as ended:
            return [f for f in frames if "rows" in f], ended.value  # the rest: nothing new


def test_a_tiled_run_draws_one_row_per_request_and_commits_its_tokens(backend, tiny_model):
    drawn, outcome = watched(backend, "auto", backend.suggest_budget(N, False))
    assert outcome.ok and drawn and len(drawn[-1]["rows"]) == N
    assert all(row["status"] == "done" for row in drawn[-1]["rows"])
    assert sorted(outcome.tokens) == list(range(N)) and len(outcome.calls) == len(outcome.plans)
    # Each card shows the canvas its request committed (up to its end of text).
    assert [len(row["cells"]) for row in drawn[-1]["rows"]] == [len(outcome.tokens[i]) for i in range(N)]
    assert all(0 < len(t) <= tiny_model.canvas_length for t in outcome.tokens.values())
    # No Refine on the lesson's cards (it would run a Generate request), nor its data in a frame.
    assert not any({"refine", "first"} & set(row) for f in drawn for row in f["rows"])


def test_the_same_run_twice_commits_the_same_tokens(backend):
    budget = backend.suggest_budget(N, False)
    assert watched(backend, "auto", budget)[1].tokens == watched(backend, "auto", budget)[1].tokens


def test_an_untiled_run_out_of_memory_ends_every_card_with_its_sentence(backend):
    drawn, outcome = watched(backend, "off", backend.suggest_budget(N, False))
    assert not outcome.ok and outcome.message == f"The sampler step of {N} requests in one tile raised torch.OutOfMemoryError."
    assert outcome.needed_bytes > outcome.free_bytes > 0 and outcome.calls == [tuple(range(N))] and not outcome.plans
    assert {row["status"] for row in drawn[-1]["rows"]} == {"error"}


def test_a_bad_budget_is_one_sentence_on_the_untiled_card(backend):
    last = list(tab.run_lesson(RunService(backend), None, N, "lots", False, STEPS))[-1]
    untiled, tiled = last["untiled"], last["tiled"]
    assert 'data-outcome="error"' in untiled and "must be a size such as 512MiB" in html.unescape(untiled)
    assert "not run yet" in tiled
