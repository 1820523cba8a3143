"""The decoder's and the sampler's shares, timed with no GPU→CPU sync of their own (engine/timing.py)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

from dgemma.engine import Engine, EngineConfig
from dgemma.engine.timing import ShareClock
from dgemma.sampling import SamplingParams

ENGINE = Path(__file__).resolve().parents[1] / "dgemma" / "engine"


class Row:
    decoder_seconds = 0.0


def test_a_charged_interval_counts_only_once_it_is_settled():
    clock, row = ShareClock(torch.device("cpu")), Row()
    start = clock.mark()
    clock.charge(start, clock.mark(), [row], "decoder_seconds")
    assert clock.totals.decoder_seconds == row.decoder_seconds == 0.0
    clock.settle()
    assert clock.totals.decoder_seconds == row.decoder_seconds > 0.0
    clock.settle()  # settled intervals are not added twice
    assert clock.totals.decoder_seconds == row.decoder_seconds


def test_the_engine_never_waits_for_the_device_to_time_its_phases():
    """The only wait is the step's own host copy (output.to_host); no `torch.cuda.synchronize` call."""
    calls = []
    for path in ENGINE.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr == "synchronize" and ast.unparse(node.value) == "torch.cuda":
                calls.append(path.name)
    assert calls == []


def test_every_request_reports_both_shares_and_they_add_up_to_its_busy_time(tiny_model):
    with Engine(tiny_model, EngineConfig(max_num_seqs=4)) as engine:
        finals = engine.run_until_done(["ab", "cde", "f"], [SamplingParams(max_denoising_steps=3, seed=i) for i in range(3)],
                                 max_new_tokens=16)
        stats = dict(engine.stats)
    for final in finals:
        m = final.extra["metrics"]
        assert m["decoder_seconds"] > 0 and m["sampler_seconds"] > 0
        assert m["decoder_share"] + m["sampler_share"] == pytest.approx(1, abs=1e-3)
    # a request's figures are rounded to four places (dgemma/metrics.py); rounding keeps the order
    assert round(stats["decoder_seconds"], 4) >= max(f.extra["metrics"]["decoder_seconds"] for f in finals)
