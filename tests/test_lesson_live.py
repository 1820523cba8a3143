"""The lesson's runs, live: each run tells its steps as events, which fold into the same board and
compact frames as a Generate run's (one row per request, one cell per canvas position)."""

from __future__ import annotations

import pytest

from dgemma.events import RequestEvent, StepEvent
from dgemma.sampling import SamplingParams
from dgemma.settings import Settings
from dgemma.ui.board import fold
from dgemma.ui.compact import frame

N, STEPS = 6, 3
SETTINGS = Settings(SamplingParams(max_denoising_steps=STEPS, seed=5))


@pytest.fixture(scope="module")
def core(tiny_model):
    from dgemma.engine import EngineCore

    return EngineCore(tiny_model)


def told(core, tiling: str, budget: str | None) -> tuple[list, object]:
    from dgemma.serving import lesson_run

    events: list = []
    outcome = lesson_run.run(core, N, budget, False, tiling, SETTINGS, on_events=events.extend)
    return events, outcome


def test_a_tiled_run_folds_into_one_row_per_request_and_commits_its_tokens(core, tiny_model):
    from dgemma.serving import lesson_run

    events, outcome = told(core, "auto", lesson_run.suggest_budget(tiny_model, N, False))
    board = fold(events)
    shown = frame(board, board.canvas_length)
    assert outcome.ok and len(shown["rows"]) == N
    assert all(len(row["cells"]) == tiny_model.canvas_length for row in shown["rows"])
    assert all(row["status"] == "done" for row in shown["rows"])
    done = {e.request_id: e.token_ids for e in events if isinstance(e, RequestEvent) and e.status == "done"}
    assert done == outcome.tokens  # what the cards commit is what the run committed
    starts = [e for e in events if isinstance(e, StepEvent) and e.step == 0]
    assert len(starts) == N and not any(any(e.accepted) for e in starts)  # every canvas shown from its random start
    assert board.plan_count == len(outcome.plans)


def test_events_never_change_the_runs_tokens(core, tiny_model):
    from dgemma.serving import lesson_run

    budget = lesson_run.suggest_budget(tiny_model, N, False)
    _, watched = told(core, "auto", budget)
    assert lesson_run.run(core, N, budget, False, "auto", SETTINGS).tokens == watched.tokens


def test_an_untiled_run_out_of_memory_ends_every_card_with_its_sentence(core, tiny_model):
    from dgemma.serving import lesson_run

    events, outcome = told(core, "off", lesson_run.suggest_budget(tiny_model, N, False))
    board = fold(events)
    assert not outcome.ok and board.finished
    assert {v.status for v in board.requests.values()} == {"error"}
    assert all(v.error == outcome.message for v in board.requests.values())


def test_the_page_watches_a_run_on_its_thread_and_gets_its_outcome(tiny_model):
    from dgemma.engine import EngineConfig
    from dgemma.serving.engine_backend import EngineBackend
    from dgemma.serving.inputs import Limits
    from dgemma.serving.lesson_live import LiveLesson
    from dgemma.ui.lesson.live import watch

    backend = EngineBackend(tiny_model, EngineConfig(max_num_seqs=N), Limits(), None)
    try:
        budget = backend.suggest_budget(N, False)
        view = watch(LiveLesson(backend, N, budget, False, "auto", SETTINGS))
        frames = []
        while True:
            try:
                frames.append(next(view))
            except StopIteration as ended:
                outcome = ended.value
                break
        drawn = [f for f in frames if "rows" in f]  # the rest are gr.skip(): nothing new to draw
        assert outcome.ok and drawn and len(drawn[-1]["rows"]) == N
        assert all(row["status"] == "done" for row in drawn[-1]["rows"])
        # No Refine on the lesson's cards (it would run a Generate request), nor its data in a frame.
        assert not any({"refine", "first"} & set(row) for f in drawn for row in f["rows"])
        assert outcome.tokens == backend.lesson(N, budget, False, "auto", SETTINGS).tokens
        with pytest.raises(ValueError, match="not a size"):  # a bad budget: its one sentence, from the thread
            list(watch(LiveLesson(backend, N, "lots", False, "auto", SETTINGS)))
    finally:
        backend.close()
