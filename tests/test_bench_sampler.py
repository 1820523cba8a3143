"""`python -m dgemma.bench sampler`: its JSON rows, the source's figure, and its bad-input lines."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

MiB = 1024**2
GiB = 1024**3


def bench(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dgemma.bench", *args], capture_output=True, text=True, timeout=300)


def test_meta_run_reproduces_the_source_figure_and_tiles_under_the_budget():
    result = bench("sampler", "--meta", "--num-decode", "16", "--budget", "8GiB", "--json")
    assert result.returncode == 0, result.stderr
    rows = {row["mode"]: row for row in map(json.loads, result.stdout.splitlines())}
    keys = {"impl", "mode", "num_decode", "canvas_length", "vocab", "group", "tiles", "peak_transient_bytes",
            "copies_per_request", "seconds", "identical_to_untiled"}  # fmt: skip
    assert keys <= set(rows["untiled"]) and keys <= set(rows["tiled"])
    assert rows["untiled"]["peak_transient_bytes"] / MiB == pytest.approx(28_672, rel=0.10)
    assert rows["tiled"]["peak_transient_bytes"] <= 4 * GiB
    assert rows["tiled"]["tiles"] > 1
    assert rows["untiled"]["seconds"] is None and rows["tiled"]["identical_to_untiled"] is None


def test_real_run_reports_time_and_identical_tokens():
    result = bench("sampler", "--vocab", "2048", "--canvas-length", "16", "--num-decode", "6",
                   "--budget", "2MiB", "--repeats", "1", "--json")  # fmt: skip
    assert result.returncode == 0, result.stderr
    rows = {row["mode"]: row for row in map(json.loads, result.stdout.splitlines())}
    assert rows["tiled"]["tiles"] > 1
    assert rows["tiled"]["identical_to_untiled"] is True
    assert rows["tiled"]["seconds"] > 0 and rows["untiled"]["seconds"] > 0


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["sampler", "--budget", "8 gigs"], "malformed size '8 gigs'"),
        (["sampler", "--canvas-length", "0"], "--canvas-length must be >= 1"),
        (["sampler", "--device", "tpu"], "unknown device 'tpu'"),
        (["sampler", "--num-decode", "0"], "--num-decode values must be >= 1"),
        (["sampler", "--impl", "magic"], "unknown --impl 'magic'"),
        (["teleport"], "choose a benchmark"),
    ],
)
def test_bad_input_exits_2_with_one_line(args, fragment):
    result = bench(*args)
    assert result.returncode == 2
    assert fragment in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert "Traceback" not in result.stderr
