"""The serving contract (no torch): a call's prompts and settings, checked against a backend's `Limits`;
`Backend.start` submits them and returns a `Run` to poll for events, cancel, or read to its end (`results`)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Protocol

from dgemma.errors import SettingsError
from dgemma.examples import LESSON_PROMPTS
from dgemma.events import FINAL, Event, RequestEvent, TilePlan
from dgemma.memory.lesson import lesson_model, suggest_budget
from dgemma.recording import Recording
from dgemma.sampling import RunOptions, SamplingParams
from dgemma.settings import Settings, parse_settings


@dataclass(frozen=True)
class Limits:
    """What one call or one tab may ask for, so that one client cannot starve the others."""

    max_prompts: int = 64  # prompts in one call (after filling up to `concurrent`)
    max_new_tokens: int = 256
    max_queued: int = 64  # requests one tab (a browser tab, an API client) may have waiting or running at once
    max_prompt_chars: int = 4000


def parse_call_settings(raw: Any, defaults: Settings, limits: Limits, max_num_seqs: int, prompts: int = 1) -> Settings:
    """`parse_settings` under this server's limits: max_new_tokens, a tile of at most max_num_seqs."""
    return parse_settings(raw, defaults, max_new_tokens=limits.max_new_tokens, max_tile=max_num_seqs, prompts=prompts)


def parse_prompts(prompts: Any, limits: Limits) -> list[str]:
    """Prompts as given (order kept); one sentence when the list is empty, too long or malformed."""
    if isinstance(prompts, str):
        prompts = [prompts]
    if not isinstance(prompts, (list, tuple)):
        raise SettingsError(f"Prompts must be a list of strings, got {type(prompts).__name__}.")
    if not prompts:
        raise SettingsError("Give at least one prompt.")
    if len(prompts) > limits.max_prompts:
        raise SettingsError(f"Too many prompts: {len(prompts)} given, at most {limits.max_prompts} per call.")
    out = []
    for i, prompt in enumerate(prompts):
        if not isinstance(prompt, str):
            raise SettingsError(f"Prompt {i + 1} must be a string, got {type(prompt).__name__}.")
        if not prompt.strip():
            raise SettingsError(f"Prompt {i + 1} is empty; write some text or remove it.")
        if len(prompt) > limits.max_prompt_chars:
            raise SettingsError(f"Prompt {i + 1} is {len(prompt)} characters long; the limit is {limits.max_prompt_chars}.")
        # Lone surrogates cannot be encoded or tokenized; say so instead of failing deep inside.
        try:
            prompt.encode("utf-8")
        except UnicodeEncodeError:
            raise SettingsError(f"Prompt {i + 1} holds characters that are not valid Unicode text.") from None
        out.append(prompt)
    return out


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

    def start(self, prompts: list[str], settings: Settings, stream: bool = True) -> Run:
        """Submit one call's prompts (seed S + i each); stream=False skips the per-step frames."""

    def suggest_budget(self, requests: int, real_scale: bool) -> str:
        """The lesson's budget: one tile of its `requests` runs out of memory, tiles of a few fit
        (dgemma/memory/lesson.py)."""

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
        return [Output(e.prompt, e.text, e.steps, e.seed or 0, e.error or ("" if e.status == "done" else e.status),
                       e.extra.get("metrics")) for e in self.last.values()]


def results(run: Run, recording: Recording | None = None) -> tuple[list[Output], list[TilePlan]]:
    """Read `run` until every request has ended (into `recording` too): outputs in submission order,
    each from its final event, and the run's tile plans."""
    progress = Progress(run.size, recording)
    while not progress.over:
        progress.add(run.poll(0.1))
    return progress.outputs(), progress.plans


def backend_state(backend: Backend) -> LoadState:
    """A backend that loads its model after the page is served has a state; any other is ready."""
    state = getattr(backend, "state", None)
    return state() if state is not None else LoadState(True, False, "")


class ModelBackend:
    """What every backend over a loaded model shares: its limits, defaults, facts and the lesson's budget."""

    def __init__(self, loaded: Any, config: Any, limits: Limits, budget_text: str | None,
                 device: str | None = None):
        self.loaded, self.config, self.limits, self.budget_text = loaded, config, limits, budget_text
        self.max_num_seqs = config.max_num_seqs
        # Plain values read now: on ZeroGPU spaces moves the main process's weights to disk after launch.
        self.lesson_model = lesson_model(loaded, config.max_num_seqs, LESSON_PROMPTS, device)
        p = SamplingParams.from_generation_config(getattr(loaded.model, "generation_config", None))
        # Two canvases by default: enough to watch a commit, short enough for a laptop (the CLI's too).
        self.defaults = Settings(params=replace(p, seed=0, greedy=False), options=RunOptions(sampler=config.sampler),
                                 max_new_tokens=min(limits.max_new_tokens, 64))
        self._facts = loaded.facts()

    def info(self) -> dict:
        return {**self._facts, "max_num_seqs": self.max_num_seqs, "memory_budget": self.budget_text or "none",
                "lesson_budget": self.suggest_budget(min(16, self.max_num_seqs), False)}

    def suggest_budget(self, requests: int, real_scale: bool) -> str:
        return suggest_budget(self.lesson_model, requests, real_scale)

    def close(self) -> None:
        pass
