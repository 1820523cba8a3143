"""`python -m dgemma.bench soak`, for a few seconds: it starts the app, drives it and prints every field.

The real soak runs for ten minutes or more (docs/reliability.md records one); this checks the
command end to end, as a user runs it, on a run short enough for the suite.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from app_server import MODEL_ARGS, ROOT

pytestmark = pytest.mark.server  # the soak benchmark launches the app and drives it

FIELDS = ("calls", "requests", "errors", "p50_s", "p99_s", "rss_start_mib", "rss_end_mib",
          "rss_growth_mib_per_10k_requests", "server_alive_after")


def test_a_short_soak_prints_requests_errors_latency_and_memory():
    out = subprocess.run(
        [sys.executable, "-m", "dgemma.bench", "soak", "--minutes", "0.05", "--clients", "2", "--warmup", "0",
         *MODEL_ARGS],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    row = dict(line.strip().split(": ", 1) for line in out.stdout.splitlines() if ": " in line)
    assert all(field in row for field in FIELDS), out.stdout
    assert int(row["requests"]) > 0 and row["errors"] == "0" and row["server_alive_after"] == "True"
    assert 0 < float(row["p50_s"]) <= float(row["p99_s"])
    assert 100 < float(row["rss_start_mib"]) and 100 < float(row["rss_end_mib"])  # the app's process, read from /proc
