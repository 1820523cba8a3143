"""The serving contract: what the views need from the engine, in one small interface (no torch).

`Backend.start` submits one call's prompts and returns a `Run`: poll it for events, cancel it,
or wait for its results. The real backend (dgemma/serving/engine_backend.py) wraps dgemma.engine.engine;
keeping the interface this small is what lets the views and the API be tested and read alone.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
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


@dataclass
class LessonOutcome:
    """One run of the lesson's batch: finished, or out of memory with the numbers."""

    tiling: str  # "off" | "auto"
    ok: bool
    message: str  # one sentence: what happened, with the numbers
    needed_bytes: int = 0
    free_bytes: int = 0
    plans: list[TilePlan] = field(default_factory=list)
    tokens: dict[int, tuple[int, ...]] = field(default_factory=dict)  # request index -> committed ids
    seconds: float = 0.0
    detail: str = ""  # the allocator's own line, for the curious
    # The requests (0-based) of every sampler call in order, the one that ran out of memory last
    # (it has no plan): tile j of call k held calls[k][sum(tiles[:j]) : sum(tiles[:j + 1])].
    calls: list[tuple[int, ...]] = field(default_factory=list)


class Backend(Protocol):
    defaults: Settings
    limits: Limits
    max_num_seqs: int

    def start(self, prompts: list[str], settings: Settings, stream: bool = True) -> Run:
        """Submit one call's prompts (seed S + i each); stream=False skips the per-step frames."""

    def lesson(self, requests: int, budget: str | None, real_scale: bool, tiling: str, settings: Settings,
               impl: str = "reference", on_events: Callable[[list[Event]], None] | None = None) -> LessonOutcome:
        """Run the lesson's batch once under `budget` (None: no budget) with tiling "off" or "auto",
        with the `impl` sampler step ("reference" or "chunked"); `on_events`, when given, gets each
        step's events as the run goes (dgemma/serving/lesson_events.py), from the thread running it."""

    def suggest_budget(self, requests: int, real_scale: bool) -> str:
        """A budget where one tile of `requests` runs out of memory but tiles of a few fit."""

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
