"""A run's figures as people read them: one formatter for the status line, the CLI and Compare's table."""

from __future__ import annotations

import pytest

from dgemma.metrics import shown, summary_line


@pytest.mark.parametrize("value, spec, text", [(None, ".1f", "-"), (3 * 2**20, "bytes", "3.0 MiB"), (0.25, ".0%", "25%"),
                                                (12, "d", "12")])
def test_a_figure_is_a_dash_when_missing_a_size_in_its_unit_else_its_format(value, spec, text):
    assert shown(value, spec) == text


def test_the_summary_line_names_each_figure_and_dashes_the_missing_ones():
    line = summary_line({"scheduler": "entropy_bound", "tokens_per_s": 3.21, "peak_sampler_bytes": 2048})
    assert line.startswith("entropy_bound · 3.2 tokens/s · - tokens per forward")
    assert line.endswith("peak sampler memory 2 KiB")
