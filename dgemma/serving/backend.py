"""The serving contract (no torch): `Backend.request` makes a call's `RunRequest` (dgemma/settings.py's
`make_request`, under the backend's `Limits` and against its model); `Backend.start` submits it and returns
a `Run` to poll for events, cancel, or read to its end (`read_run`)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Protocol

from dgemma.errors import sentence
from dgemma.examples import lesson_prompts
from dgemma.events import FINAL, Event, RequestEvent, Status, TilePlan
from dgemma.gpus import RELEASED_VOCAB
from dgemma.memory.ledger import Ledger, budget_text, refusal
from dgemma.recording import Recording
from dgemma.sampling import RunOptions, SamplingParams
from dgemma.settings import CanvasModel, Limits, RunRequest, Settings, make_request


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

    def poll(self, timeout: float) -> list[Event]:
        """Events that arrived within `timeout` seconds (possibly none)."""

    def cancel(self) -> None:
        """Stop this run's requests (queued ones never start; running ones free their slots)."""

    def close(self) -> None:
        """The reader is done: cancel anything unfinished and stop delivering events."""


class Backend(Protocol):
    defaults: Settings
    limits: Limits
    max_num_seqs: int

    def request(self, prompts: Any, raw: Any) -> RunRequest:
        """One call's prompts and raw settings, checked and resolved (make_request); ValueError: one sentence."""

    def canvas_model(self) -> CanvasModel: ...  # what a first canvas reads of the model (still loading: ValueError)

    def start(self, call: RunRequest, stream: bool = True) -> Run:
        """Submit one call's prompts (seed S + i each); stream=False skips the per-step frames."""

    def suggest_budget(self, requests: int, real_scale: bool) -> str:
        """The lesson's budget: one tile of its `requests` runs out of memory, tiles of a few fit."""

    def info(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class LoadState:
    """What the page shows in its status line while (or after) the model loads."""

    ready: bool
    failed: bool
    message: str  # one sentence: "Loading model … (4 s): reading the weights." | the failure | ""


class Progress:
    """A run as its events tell it: each request's last event and the run's tile plans; every event
    also appended to `recording` (None: not kept), so what a reader folds and what it keeps are the same."""

    def __init__(self, size: int, recording: Recording | None = None) -> None:
        self.size, self.recording = size, recording
        self.last: dict[int, RequestEvent] = {}  # request id -> its last event, in the order they first came
        self.plans: list[TilePlan] = []

    def add(self, events: list[Event]) -> list[Event]:
        if self.recording is not None:
            self.recording.extend(events)
        for e in events:
            if isinstance(e, TilePlan):
                self.plans.append(e)
            elif isinstance(e, RequestEvent):
                self.last[e.request_id] = e
        return events

    def ended(self) -> int:
        return sum(e.status in FINAL for e in self.last.values())

    @property
    def over(self) -> bool:
        return len(self.last) >= self.size and self.ended() == len(self.last)

    def outputs(self) -> list[Output]:
        return [Output(e.prompt, e.text, e.steps, e.seed or 0, e.error or ("" if e.status == Status.DONE else e.status),
                       e.extra.get("metrics")) for e in self.last.values()]


def read_run(run: Run, recording: Recording | None = None) -> Progress:
    """Read `run` until every request has ended (into `recording` too): `outputs()` in submission order, `plans`."""
    progress = Progress(run.size, recording)
    while not progress.over:
        progress.add(run.poll(0.1))
    return progress


def backend_state(backend: Backend) -> LoadState:
    """A backend that loads its model after the page is served has a state; any other is ready."""
    return backend.state() if hasattr(backend, "state") else LoadState(True, False, "")


class ModelBackend:
    """What every backend over a loaded model shares: limits, defaults, facts, and a run's memory ledger."""

    def __init__(self, loaded: Any, config: Any, limits: Limits, budget_text: str | None,
                 device: str | None = None):
        self.loaded, self.config, self.limits, self.budget_text = loaded, config, limits, budget_text
        self.max_num_seqs = config.max_num_seqs
        # Plain values read now: on ZeroGPU spaces moves the main process's weights to disk after launch.
        self.ledger_facts = loaded.ledger_facts(config.max_num_seqs, device)
        p = SamplingParams.from_generation_config(getattr(loaded.model, "generation_config", None))
        # Two canvases by default: enough to watch a commit, short enough for a laptop (the CLI's too).
        self.defaults = Settings(params=replace(p, seed=0, greedy=False), options=RunOptions(sampler=config.sampler),
                                 max_new_tokens=min(limits.max_new_tokens, 64))
        self._facts = loaded.facts()
        self.encode_text = loaded.encode_text  # text to token ids, for a first canvas
        self.encode_prompt = loaded.encode  # a prompt's ids as the engine takes them, for the ledger

    def info(self) -> dict:
        return {**self._facts, "max_num_seqs": self.max_num_seqs, "memory_budget": self.budget_text or "none",
                "lesson_budget": self.suggest_budget(min(16, self.max_num_seqs), False)}

    def request(self, prompts: Any, raw: Any) -> RunRequest:
        try:
            return make_request(prompts, raw, self.defaults, self.limits, self.max_num_seqs, self.canvas_model)
        except ValueError as err:
            raise ValueError(sentence(str(err))) from None

    def canvas_model(self) -> CanvasModel:
        return CanvasModel(self.loaded.canvas_length, self.encode_text)

    def ledger(self, prompts: list[str], params: SamplingParams, max_new_tokens: int,
               options: RunOptions) -> tuple[Ledger, int]:
        """What a run of `prompts` with `options` holds with one request a tile, and the budget suggested for it."""
        from dgemma.sampling import call_ledger  # torch (meta tensors): only once a model, and so torch, has loaded

        default = RunOptions(tiling=self.config.tiling, sampler=self.config.sampler)  # the engine's own sampler's
        tokens = [len(self.encode_prompt(p)) for p in prompts]
        return call_ledger(self.ledger_facts, tokens, params, max_new_tokens, options, default, self.config.memory_budget)

    def check_budget(self, call: RunRequest, options: RunOptions) -> None:
        """ValueError, one sentence, when the run's budget cannot hold it even one request a tile: nothing runs.
        No budget (the run's or the server's): nothing to check, so no prompt is tokenized twice for it."""
        if (options.memory_budget or self.config.memory_budget) is None:
            return
        if problem := refusal(*self.ledger(call.prompts, call.settings.params, call.settings.max_new_tokens, options)):
            raise ValueError(problem)

    def suggest_budget(self, requests: int, real_scale: bool) -> str:
        """The lesson's budget for its batch of `requests` (one canvas each) at this scale (docs/tiling.md, section 5)."""
        options = RunOptions(tiling="off", fail_on_oom=True, pad_vocab=RELEASED_VOCAB if real_scale else None)
        params, canvas = self.defaults.params, self.ledger_facts.canvas_length
        return budget_text(self.ledger(lesson_prompts(requests), params, canvas, options)[1])

    def close(self) -> None:
        pass
