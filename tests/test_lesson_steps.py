"""The lesson, call by call: at call k, which requests each tile held and the memory it used."""

from __future__ import annotations

import re

import pytest

from dgemma.memory import format_bytes
from dgemma.serving.runs import RunService
from dgemma.ui.lesson.steps import render_call

N = 8


@pytest.fixture(scope="module")
def lesson(tiny_model):
    from dgemma.engine import EngineConfig
    from dgemma.serving.engine_backend import EngineBackend
    from dgemma.settings import Limits
    from dgemma.ui.lesson.tab import run_lesson

    backend = EngineBackend(tiny_model, EngineConfig(max_num_seqs=N), Limits(), None)
    try:
        runs = {}
        for _ in run_lesson(RunService(backend), None, N, backend.suggest_budget(N, False), False, 3, runs):
            pass
    finally:
        backend.close()
    return runs["untiled"], runs["tiled"]


def test_the_untiled_runs_last_call_is_one_tile_of_every_request_out_of_memory(lesson):
    untiled, _ = lesson
    assert not untiled.ok and untiled.calls[-1] == tuple(range(N)) and len(untiled.calls) == len(untiled.plans) + 1
    shown = render_call(untiled, len(untiled.calls))
    assert 'class="lesson-call oom"' in shown and f"one tile</b> holding requests #1–#{N}" in shown
    assert format_bytes(untiled.needed_bytes) in shown and format_bytes(untiled.free_bytes) in shown


def test_each_tiled_call_shows_the_requests_of_every_tile_and_its_memory(lesson):
    _, tiled = lesson
    assert tiled.ok and len(tiled.calls) == len(tiled.plans) >= 1
    for k, (rows, plan) in enumerate(zip(tiled.calls, tiled.plans, strict=True), start=1):
        assert sum(plan.tiles) == len(rows) == plan.num_decode  # the tiles partition the call's requests
        shown = render_call(tiled, k)
        tiles = re.findall(r"<li>tile (\d+): (\d+) requests, ([^·]+) · about ([^(]+) \(", shown)
        assert [int(size) for _, size, _, _ in tiles] == list(plan.tiles)
        assert [t[3].strip() for t in tiles] == [format_bytes(size * plan.bytes_per_request) for size in plan.tiles]
        assert format_bytes(plan.peak_transient_bytes) in shown and format_bytes(plan.free_bytes) in shown
    first = render_call(tiled, 1)
    size = tiled.plans[0].tiles[0]
    assert f"tile 1: {size} requests, #1–#{size} ·" in first and len(tiled.plans[0].tiles) > 1  # tiled for real
