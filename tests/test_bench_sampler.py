"""`python -m dgemma.bench sampler`: its JSON rows, the source's figure, and its bad-input lines.

Each test runs the command in this process, as its `__main__` does (conftest's `bench`)."""

from __future__ import annotations

import json

import pytest

MiB = 1024**2
GiB = 1024**3


def test_meta_run_reproduces_the_source_figure_and_tiles_under_the_budget(bench):
    result = bench("sampler", "--meta", "--num-decode", "16", "--budget", "8GiB", "--baseline", "seed", "--json")
    assert result.returncode == 0, result.stderr
    rows = {(row["impl"], row["mode"]): row for row in map(json.loads, result.stdout.splitlines())}
    keys = {"impl", "mode", "num_decode", "canvas_length", "vocab", "group", "tiles", "peak_transient_bytes",
            "copies_per_request", "seconds", "identical_to_untiled", "floor_seconds"}  # fmt: skip
    untiled, tiled, seed = rows["reference", "untiled"], rows["reference", "tiled"], rows["seed", "untiled"]
    assert keys <= set(untiled) and keys <= set(tiled) and keys <= set(seed)
    assert seed["peak_transient_bytes"] / MiB == pytest.approx(28_672, rel=0.10)  # the source's figure
    assert untiled["peak_transient_bytes"] < seed["peak_transient_bytes"] / 3
    assert tiled["peak_transient_bytes"] <= 4 * GiB
    assert tiled["tiles"] > 1
    assert untiled["seconds"] is None and tiled["identical_to_untiled"] is None


def test_a_tiled_row_of_several_tiles_carries_the_floor_tiled_the_same_way(bench):
    result = bench("sampler", "--vocab", "2048", "--canvas-length", "8", "--num-decode", "4", "--hidden", "16",
                   "--budget", "400KiB", "--repeats", "1", "--json")  # fmt: skip
    assert result.returncode == 0, result.stderr
    untiled, tiled = map(json.loads, result.stdout.splitlines())
    assert tiled["tiles"] > 1 and tiled["floor_time_ratio_tiled_vs_untiled"] > 0
    assert "floor_time_ratio_tiled_vs_untiled" not in untiled


def test_seed_baseline_prints_time_ratios_and_the_floor(bench):
    result = bench("sampler", "--vocab", "2048", "--canvas-length", "8", "--num-decode", "3", "--hidden", "16",
                   "--impl", "reference", "chunked", "--baseline", "seed", "--repeats", "1", "--json")  # fmt: skip
    assert result.returncode == 0, result.stderr
    rows = {(row["impl"], row["mode"]): row for row in map(json.loads, result.stdout.splitlines())}
    assert set(rows) == {("seed", "untiled")} | {(i, m) for i in ("reference", "chunked") for m in ("untiled", "tiled")}
    for key, row in rows.items():
        assert row["floor_seconds"] > 0
        assert (row.get("time_ratio_vs_seed", 0) > 0) == (key[0] != "seed")
    assert rows["chunked", "tiled"]["identical_to_reference"] is True


def test_pins_add_a_pinned_row_timed_against_the_tiled_step(bench):
    result = bench("sampler", "--vocab", "2048", "--canvas-length", "8", "--num-decode", "3", "--hidden", "16",
                   "--impl", "reference", "chunked", "--pins", "--repeats", "1", "--json")  # fmt: skip
    assert result.returncode == 0, result.stderr
    rows = {(row["impl"], row["mode"]): row for row in map(json.loads, result.stdout.splitlines())}
    for impl in ("reference", "chunked"):
        pinned, tiled = rows[impl, "pinned"], rows[impl, "tiled"]
        assert pinned["time_ratio_pinned_vs_tiled"] == round(pinned["seconds"] / tiled["seconds"], 3)
        # Pins add only their own [n, CL] rows (int64 tokens, a mask) to the step's transient.
        assert 0 <= pinned["peak_transient_bytes"] - tiled["peak_transient_bytes"] <= 3 * 8 * (8 + 8)


def test_real_run_reports_time_and_identical_tokens(bench):
    result = bench("sampler", "--vocab", "2048", "--canvas-length", "16", "--num-decode", "6",
                   "--budget", "2MiB", "--repeats", "1", "--json")  # fmt: skip
    assert result.returncode == 0, result.stderr
    rows = {row["mode"]: row for row in map(json.loads, result.stdout.splitlines())}
    assert rows["tiled"]["tiles"] > 1
    assert rows["tiled"]["identical_to_untiled"] is True
    assert rows["tiled"]["seconds"] > 0 and rows["untiled"]["seconds"] > 0


def test_scheduler_rows_come_in_the_same_run_each_with_its_floor_and_identical_when_tiled(bench):
    result = bench("sampler", "--vocab", "2048", "--canvas-length", "16", "--num-decode", "6", "--budget", "2MiB",
                   "--repeats", "1", "--scheduler", "entropy_bound", "block_refinement", "discrete_ddim", "--json")  # fmt: skip
    assert result.returncode == 0, result.stderr
    rows = {(row["scheduler"], row["mode"]): row for row in map(json.loads, result.stdout.splitlines())}
    for scheduler in ("entropy_bound", "block_refinement", "discrete_ddim"):
        tiled = rows[scheduler, "tiled"]
        assert tiled["tiles"] > 1 and tiled["identical_to_untiled"] is True
        assert tiled["floor_seconds"] > 0 and tiled["time_ratio_vs_floor"] > 0


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["sampler", "--budget", "8 gigs"], "malformed size '8 gigs'"),
        (["sampler", "--canvas-length", "0"], "argument --canvas-length: expected a number of at least 1, got 0"),
        (["sampler", "--device", "tpu"], "unknown device 'tpu'"),
        (["sampler", "--num-decode", "0"], "argument --num-decode: expected a number of at least 1, got 0"),
        (["sampler", "--impl", "magic"], "argument --impl: invalid choice: 'magic'"),
        (["sampler", "--baseline", "vllm"], "invalid choice: 'vllm'"),
        (["teleport"], "choose a benchmark"),
    ],
)
def test_bad_input_exits_2_with_one_line(bench, args, fragment):
    result = bench(*args)
    assert result.returncode == 2
    assert fragment in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert "Traceback" not in result.stderr
