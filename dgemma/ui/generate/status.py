"""The Generate tab's status line: how many requests are where, sampler calls, time; or a failure."""

from __future__ import annotations

import time

from dgemma.metrics import run_summary, summary_line
from dgemma.ui.board import Board


def run_status(board: Board, started: float) -> str:
    """The line while a run streams: requests per status, sampler calls so far, seconds since Run."""
    counts: dict[str, int] = {}
    for view in board.requests.values():
        counts[view.status] = counts.get(view.status, 0) + 1
    parts = ", ".join(f"{n} {status}" for status, n in counts.items())
    return f"{parts} · {board.plan_count} sampler calls · {time.monotonic() - started:.1f} s"


def board_summary(board: Board, started: float) -> dict:
    """The run's quoted figures (dgemma/metrics.py) from its cards' final events and its wall time."""
    return run_summary([view.metrics for view in board.requests.values()], time.monotonic() - started)


def finished_status(board: Board, started: float, summary: dict) -> str:
    """The line when a run has ended, and under it the run summary: the figures people quote."""
    return f"{run_status(board, started)}\n\n**Run summary:** {summary_line(summary)}"


def failed_status(sentence: str) -> str:
    """The status line after a failure: the one sentence, marked so it reads as one."""
    return f"⚠️ {sentence}"
