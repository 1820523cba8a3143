"""`python -m dgemma.bench lesson`: the lesson's run tiled under its budget against untiled with room."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.embedded  # runs `python -m dgemma.bench lesson` (conftest's `bench`) on the shipped model


def test_the_lessons_tiled_run_is_timed_against_its_untiled_one_with_identical_tokens(bench):
    result = bench("lesson", "--requests", "4", "--steps", "2", "--repeats", "1", "--model-vocab")
    assert result.returncode == 0, result.stderr
    rows = {line.split()[0]: line.split() for line in result.stdout.splitlines()[2:]}
    assert set(rows) == {"reference", "chunked"}
    assert "+" in rows["reference"][1]  # the reference step splits under the budget the tab suggests
    for _, _, tiled_s, untiled_s, ratio, identical in rows.values():
        assert float(tiled_s) > 0 and float(untiled_s) > 0 and float(ratio) > 0
        assert identical == "True"


def test_an_unknown_step_is_one_line_and_exit_status_2(bench):
    result = bench("lesson", "--impl", "fastest")
    assert result.returncode == 2 and result.stderr.strip().count("\n") == 0
    assert "argument --impl: invalid choice: 'fastest'" in result.stderr
