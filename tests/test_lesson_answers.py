"""The lesson's cards show whole answers: at the tab's defaults (16 requests, 8 denoising steps, the
suggested budget, the server's scheduler) each request's text is the one `python -m dgemma.generate`
gives for the same prompt and seed, with the canvases it wants (the embedded model)."""

from __future__ import annotations

import pytest

from conftest import generate_json
from dgemma.examples import lesson_prompts
from dgemma.serving.runs import RunService
from dgemma.ui.lesson import tab

N, STEPS = 16, 8  # the tab's defaults (tab.build)


@pytest.fixture(scope="module")
def backend(embedded_model):
    from dgemma.engine import EngineConfig
    from dgemma.serving.engine_backend import EngineBackend
    from dgemma.settings import Limits

    backend = EngineBackend(embedded_model, EngineConfig(max_num_seqs=32), Limits(), None)  # app.py's --max-num-seqs
    yield backend
    backend.close()


def test_the_lessons_cards_show_the_same_whole_answers_as_the_cli(backend, capsys):
    runs: dict = {}
    boards = [update["board"] for update in tab.run_lesson(RunService(backend), None, N, backend.suggest_budget(N, False),
                                                            False, STEPS, runs) if "rows" in update.get("board", {})]
    assert not runs["untiled"].ok and runs["tiled"].ok  # the lesson as it is: untiled out of memory, tiled fits
    shown = [row["text"] for row in boards[-1]["rows"]]  # the tiled run's cards, as the class reads them
    cli = generate_json(capsys, *sum((["--prompt", p] for p in lesson_prompts(N)), []), "--max-denoising-steps", str(STEPS))
    assert all(o["status"] == "done" for o in cli)
    assert shown == [o["text"] for o in cli]
    assert {p: t for p, t in zip(lesson_prompts(N), shown)} == {  # and they are right
        "add 12+34": "46", "reverse hello": "olleh", "count 5 to 9": "5 6 7 8 9", "sort 3 1 4 1 5": "1 1 3 4 5"}
