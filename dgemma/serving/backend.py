"""The serving contract (no torch): `Backend.request` makes a call's `RunRequest` (dgemma/settings.py's
`make_request`, under the backend's `Limits` and against its model); `Backend.start` submits it and returns
a `Run` to poll for events, cancel, or read to its end (`results`)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Protocol

from dgemma.errors import sentence
from dgemma.examples import LESSON_PROMPTS
from dgemma.events import FINAL, Event, RequestEvent, TilePlan
from dgemma.memory.lesson import LessonModel, lesson_model, lesson_vocab
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

    def start(self, request: RunRequest, stream: bool = True) -> Run:
        """Submit one call's prompts (seed S + i each); stream=False skips the per-step frames."""

    def suggest_budget(self, requests: int, real_scale: bool) -> str:
        """The lesson's budget: one tile of its `requests` runs out of memory, tiles of a few fit
        (`suggest_budget` below)."""

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
        self.encode_text = loaded.encode_text  # text to token ids, for a first canvas

    def info(self) -> dict:
        return {**self._facts, "max_num_seqs": self.max_num_seqs, "memory_budget": self.budget_text or "none",
                "lesson_budget": self.suggest_budget(min(16, self.max_num_seqs), False)}

    def request(self, prompts: Any, raw: Any) -> RunRequest:
        try:
            return make_request(prompts, raw, self.defaults, self.limits, self.max_num_seqs, self.canvas_model())
        except ValueError as err:
            raise ValueError(sentence(str(err))) from None

    def canvas_model(self) -> CanvasModel:
        return CanvasModel(self.loaded.canvas_length, self.encode_text)

    def suggest_budget(self, requests: int, real_scale: bool) -> str:
        return suggest_budget(self.lesson_model, requests, real_scale)

    def close(self) -> None:
        pass


def suggest_budget(model: LessonModel, requests: int, real_scale: bool) -> str:
    """The lesson's budget (docs/tiling.md, section 5): what the engine holds during the run (weights, its
    default sampler, the lesson sampler's state, the requests' KV caches) plus 3/4 of one untiled tile's
    need, so the untiled step runs out of memory and tiles of about 3/8 of the batch fit."""
    # Imported here, not at the top: this module is the torch-free contract the views import, and the
    # budget is asked for only once a model (and so torch) has loaded.
    import torch

    from dgemma.engine.resident import tensor_bytes
    from dgemma.sampling import LMHead, SamplerConfig, TiledSampler, calibrate_tile, reference_tile

    vocab = lesson_vocab(model, real_scale)
    dtype = getattr(torch, model.embed_dtype)

    def state(vocab_size: int) -> int:  # a sampler's per-slot state, the embedding it reads included
        embed = torch.empty(vocab_size, model.hidden_size, dtype=dtype, device="meta")
        return tensor_bytes(TiledSampler(SamplerConfig(model.max_num_seqs, model.canvas_length, vocab_size, embed, model.embed_scale)))

    head = LMHead(torch.empty(model.vocab_size, model.hidden_size, dtype=dtype, device="meta"), model.softcap, vocab)
    embed = torch.empty(vocab, model.hidden_size, dtype=dtype, device="meta")
    calibration = calibrate_tile(reference_tile, model.canvas_length, vocab, embed, head, device=torch.device(model.device))
    tokens = sum(model.prompt_tokens[i % len(model.prompt_tokens)] for i in range(requests))
    held = model.weight_bytes + state(model.vocab_size) + state(vocab) + tokens * model.kv_bytes_per_token
    free = max(int(0.75 * calibration.tile_bytes(requests)), 2 * calibration.tile_bytes(1) + calibration.bytes_per_request)
    mib = -(-(held + free) // 2**20)  # whole MiB when that is close enough (readable); KiB for a tiny model
    return f"{mib}MiB" if mib >= 64 else f"{-(-(held + free) // 1024)}KiB"
