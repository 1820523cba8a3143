"""Load: many concurrent API clients, every request completed exactly once and equal to the CLI's.

The small version of `python -m dgemma.bench load` (64 clients x 2 prompts): same code, 8 clients.
"""

from __future__ import annotations

import pytest

from app_server import MODEL

from dgemma.bench.load import run_load

pytestmark = pytest.mark.server  # the load benchmark launches the app and drives it


def test_concurrent_clients_each_get_their_answers_exactly_once_and_equal_to_the_cli(tmp_path):
    row = run_load(clients=8, per_client=2, max_new_tokens=16, model=MODEL, timeout_s=300, log_dir=tmp_path)
    assert row["errors"] == 0, row["first_error"]
    assert row["completed_exactly_once"] == row["requests"] == 16
    assert row["equal_to_cli"] == 16
    assert row["server_alive_after"]
