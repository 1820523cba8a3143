"""`python -m dgemma.bench decoder`: per canvas, whole batch and the eager loop, side by side."""

from __future__ import annotations

import json

from dgemma.bench import main
from dgemma.reproducible import mkl_strict_mode_holds

TOY = ["--device", "cpu", "--experts", "16", "--top-k", "2", "--hidden", "64", "--moe-intermediate", "32",
       "--intermediate", "128", "--heads", "4", "--head-dim", "16", "--vocab", "1024", "--canvas-length", "16",
       "--prompt-tokens", "8", "--repeats", "1"]  # fmt: skip


def test_it_prints_a_row_per_mode_and_canvas_count_with_the_ratio_to_per_canvas(capsys):
    assert main(["decoder", *TOY, "--canvases", "1", "3", "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["canvases"], r["mode"]) for r in rows] == [
        (n, m) for n in (1, 3) for m in ("per_canvas", "whole_batch", "eager")]
    for row in rows:
        assert row["seconds"] > 0 and row["experts"] == 16 and row["top_k"] == 2
        # Per canvas is invariant on any CPU; the others only where MKL's strict mode is in force.
        assert row["equal_to_per_canvas"] is True or (row["canvases"] > 1 and not mkl_strict_mode_holds())
    assert {r["vs_per_canvas"] for r in rows if r["mode"] == "per_canvas"} == {1.0}


def test_its_table_names_the_widths_and_every_mode(capsys):
    assert main(["decoder", *TOY, "--canvases", "2"]) == 0
    out = capsys.readouterr().out
    assert "16 experts top-2, hidden 64" in out
    assert all(mode in out for mode in ("per_canvas", "whole_batch", "eager"))
    assert f"MKL strict: {'yes' if mkl_strict_mode_holds() else 'no (MKL has it on Intel CPUs only)'}" in out
