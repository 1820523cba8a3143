"""The serving contract: what the views need from the engine, in one small interface (no torch).

`Backend.start` submits one call's prompts and returns a `Run`: poll it for events, cancel it,
or wait for its results. The real backend (dgemma/serving/engine_backend.py) wraps dgemma.engine.engine;
keeping the interface this small is what lets the views and the API be tested and read alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from dgemma.events import Event, TilePlan
from dgemma.recording import Recording
from dgemma.serving.inputs import Limits
from dgemma.settings import Settings


@dataclass
class Output:
    """One finished request, in the API's shape."""

    prompt: str
    text: str
    steps: int
    seed: int
    error: str = ""
    metrics: dict | None = None  # the quoted figures (dgemma/metrics.py); None when it never ran


class Run(Protocol):
    size: int  # requests in this run
    # None, or a Recording that every event `poll` returns is appended to (in order, none merged
    # or dropped), so what the reader folds and what it keeps are the same events.
    recording: Recording | None

    def poll(self, timeout: float) -> list[Event]:
        """Events that arrived within `timeout` seconds (possibly none)."""

    def cancel(self) -> None:
        """Stop this run's requests (queued ones never start; running ones free their slots)."""

    def close(self) -> None:
        """The reader is done: cancel anything unfinished and stop delivering events."""

    def results(self) -> tuple[list[Output], list[TilePlan]]:
        """Block until every request finished; outputs in submission order, the run's tile plans."""


class Backend(Protocol):
    defaults: Settings
    limits: Limits
    max_num_seqs: int

    def start(self, prompts: list[str], settings: Settings, stream: bool = True) -> Run:
        """Submit one call's prompts (seed S + i each); stream=False skips the per-step frames."""

    def suggest_budget(self, requests: int, real_scale: bool) -> str:
        """The lesson's budget: one tile of its `requests` runs out of memory, tiles of a few fit
        (dgemma/serving/lesson_budget.py)."""

    def info(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class LoadState:
    """What the page shows in its status line while (or after) the model loads."""

    ready: bool
    failed: bool
    message: str  # one sentence: "Loading model … (4 s): reading the weights." | the failure | ""


def backend_state(backend: Backend) -> LoadState:
    """A backend that loads its model after the page is served has a state; any other is ready."""
    state = getattr(backend, "state", None)
    return state() if state is not None else LoadState(True, False, "")
