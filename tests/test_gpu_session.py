"""`bash scripts/gpu_session.sh`, dry run: every part at toy size on the CPU, so the GPU's one run cannot rot."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.server  # runs scripts/gpu_session.sh

ROOT = Path(__file__).resolve().parents[1]
PARTS = ["build", "engine", "lesson", "app", "decoder", "sampler", "sampler-real"]


def test_the_dry_run_prints_every_figure_and_every_part_ends_in_its_limit(tmp_path):
    env = {**os.environ, "DGEMMA_SESSION_TOY": "1", "PYTHON": "python"}
    done = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_session.sh"), str(tmp_path)], capture_output=True,
                          text=True, timeout=1800, cwd=ROOT, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    figures = [json.loads(line) for line in (tmp_path / "figures.jsonl").read_text().splitlines()]
    parts = {f["part"]: f for f in figures if f.get("figure") == "part"}
    assert list(parts) == PARTS
    assert [name for name, f in parts.items() if f["exit"] != 0] == [], done.stdout[-3000:]
    by = lambda kind: [f for f in figures if f.get("figure") == kind]  # noqa: E731

    (versions,) = by("versions")
    assert versions["torch"] and versions["transformers"] and versions["device"] == "cpu"
    (build,) = by("build")
    assert build["weight_bytes"] > 0 and build["free_bytes_after_load"] > 0
    engine = by("engine")
    assert {(r["experts"], r["sampler"]) for r in engine} == {("per_canvas", "eager"), ("whole_batch", "eager")}
    for row in engine:
        assert row["seconds_per_step"] > 0 and row["canvas_tokens_per_s"] > 0 and row["tile_plans"]
        assert row["token_fraction_equal_to_first"] == 1.0  # a CPU: whole batch is exact under MKL's strict mode
    assert by("generate")[0]["canvas_tokens_per_s"] > 0
    lesson = {r["tiling"]: r["outcome"] for r in by("lesson")}
    assert lesson == {"off": "out of memory", "auto": "completed"}
    assert by("lesson_tokens")[0]["tiled_equal_to_untiled"] is True
    (app,) = by("app_generate")
    assert app["weights"] == "random" and app["requests"] == 4 and app["summary"]
    (stream,) = by("app_stream")
    assert stream["updates_per_s"] > 0 and stream["page_get_p50_s"] > 0  # the page answered while the run streamed
    assert {r["mode"] for r in figures if r.get("bench") == "decoder"} == {"per_canvas", "whole_batch", "eager"}
    sampler_rows = [r for r in figures if "impl" in r and "tiles" in r]
    assert max(r["tiles"] for r in sampler_rows) > 1  # sampler-real's budget tiled the step, as on the GPU
