"""`EngineCore`: continuous batching over one loaded model, one `step()` at a time, no thread inside.

Any thread may `submit`, `cancel` and `subscribe`; `drive` (engine/driver.py) calls `step()` until
`has_unfinished()` is False. A step is three phases under `lock`, vLLM v1's: `schedule()` (the only
place a request joins, is preempted or cancelled) -> execute (engine/phases.py: encode, decode and
sample exactly that set) -> update (engine/lifecycle.py: fold the outputs in, emit events), and
returns them typed (`EngineStep`). Every use of the weights is a request (the lesson's runs too,
with their own `RunOptions`), so nothing else runs on them between two steps.
The algorithm and its memory handling: docs/design.md, "The engine".
"""

from __future__ import annotations

import itertools
import math
import threading
from collections import deque
from dataclasses import asdict, dataclass

import torch

from dgemma.events import Status
from dgemma.engine.lifecycle import Lifecycle
from dgemma.engine.mailbox import Mailbox
from dgemma.engine.output import Detokenizer, Subscribers, request_event
from dgemma.engine.phases import ExecuteOutput, ModelPhases
from dgemma.engine.requests import RequestLimits, Request, RequestHandle, check_request
from dgemma.engine.resident import Resident
from dgemma.engine.samplers import SamplerPool
from dgemma.engine.scheduler import Scheduler
from dgemma.memory import MemoryDevice, format_bytes, memory_for
from dgemma.model.loading import LoadedModel
from dgemma.model.runner import Runner
from dgemma.sampling import RunOptions, SamplingParams
from dgemma.sampling.start import CanvasStart
from dgemma.settings import RunRequest


class EngineError(RuntimeError):
    """The engine cannot start (e.g. the memory budget is smaller than the weights)."""


@dataclass(frozen=True)
class EngineConfig:
    max_num_seqs: int = 8  # requests denoising at once (slots)
    tiling: str | int = "auto"  # default RunOptions.tiling: auto | off | N requests per tile
    sampler: str = "reference"  # default RunOptions.sampler: reference (eager, the lesson's) | chunked
    memory_budget: int | None = None  # bytes: on a CPU a virtual device; on CUDA a per-process cap
    max_waiting: int = 10_000  # requests queued in total, beyond which submit refuses
    auto_restart: bool = True  # a dead engine thread restarts itself (running requests fail)
    max_restarts: int = 5  # ... at most this many times in a row without a successful step


@dataclass(frozen=True)
class SchedulerOutput:
    """What runs this step: every running request in slot order (the decoder batch's row order)."""

    rows: list[Request]
    admitted: list[Request]  # joined this step
    preempted: list[Request]  # sent back to the queue to make room for last step's request short of memory


@dataclass(frozen=True)
class EngineStep:
    """A step's typed output: what was scheduled and what the model and the sampler did with it."""

    scheduled: SchedulerOutput
    executed: ExecuteOutput


class EngineCore:
    """Requests in, events out; `step()` advances every running request by one denoising step."""

    def __init__(self, loaded: LoadedModel, config: EngineConfig = EngineConfig()):
        if not isinstance(config.max_num_seqs, int) or config.max_num_seqs < 1:
            raise EngineError(f"max_num_seqs must be a whole number >= 1, got {config.max_num_seqs!r}")
        try:
            self.default_options = RunOptions(tiling=config.tiling, sampler=config.sampler)
            self.memory: MemoryDevice = memory_for(loaded.device, config.memory_budget)
        except ValueError as err:
            raise EngineError(str(err)) from None
        self.loaded = loaded
        self.config = config
        self.lock = threading.RLock()  # held by step() and by what must see no step (a failure, shutdown)
        self.default_params = SamplingParams.from_generation_config(getattr(loaded.model, "generation_config", None))
        self.resident = Resident(self.memory)
        try:
            self.resident.hold(loaded.weight_bytes, "weights")
        except Exception:  # noqa: BLE001 - torch.OutOfMemoryError from a budget below the weights
            raise EngineError(self.resident.refuse_to_start(loaded.weight_bytes, "the model weights")) from None
        self.steps = 0  # steps taken; every other counter is its part's own (`stats`)
        self.detok = Detokenizer(loaded.tokenizer)
        self.subscribers = Subscribers()
        self.scheduler = Scheduler(config.max_num_seqs)
        self.samplers = SamplerPool(loaded, config.max_num_seqs, self.memory, self.resident, self.default_options)
        try:  # built now, so that what the engine holds between runs is the same before and after the first
            self.samplers.get(self.default_options)
        except torch.OutOfMemoryError:
            cap = format_bytes(self.memory.capacity_bytes() or 0)
            raise EngineError(f"the memory budget of {cap} is too small for the sampler's per-slot state beside "
                              "the model weights") from None
        self.lifecycle = Lifecycle(self.scheduler, self.samplers, self.resident, self.subscribers, self.detok,
                                   set(loaded.eos_token_ids), self._forget_subscriber, loaded.tokenizer.pad_token_id)
        self.phases = ModelPhases(Runner(loaded.model), self.samplers, self.memory, self.resident,
                                  loaded.tokenizer.pad_token_id or 0)  # the runner's one owner
        self._last = EngineStep(SchedulerOutput([], [], []), ExecuteOutput())  # its `short`: the next schedule's
        self._limits = RequestLimits(loaded.canvas_length, loaded.max_positions)
        self._ids = itertools.count(1)
        self.intake = threading.Condition()  # guards everything below; notified on submit and cancel
        self._inbox: deque[Request] = deque()  # submitted, not yet taken by step()
        self._cancels: dict[int, str] = {}  # request id -> reason
        self._subscriber_of: dict[int, str | None] = {}  # request id -> subscriber, for cancel_subscriber
        self.refusal = ""  # set: submit fails every request with this sentence (a stopped engine)

    # ------------------------------------------------------------------ the thread-safe API

    def submit(self, prompt: str, params: SamplingParams | None = None, max_new_tokens: int = 64,
               subscriber: str | None = None, stream_steps: bool = True, options: RunOptions | None = None,
               start: CanvasStart | None = None) -> RequestHandle:
        """Queue one prompt, its values checked at the door (dgemma/settings.py's `make_request`): a prompt the
        model has no room for fails its request (the handle's final event says so); a wrong type: TypeError.

        `start`: its first canvas, resolved from text by the caller (dgemma/settings.py's `make_request`):
        tokens from position 0 (transformers' `decoder_input_ids`) and pins held throughout."""
        params = params if params is not None else self.default_params
        options = options if options is not None else self.default_options
        error, ids = check_request(prompt, params, options, max_new_tokens, self._limits, self.tokenize)
        rid = next(self._ids)
        handle = RequestHandle(self.cancel, rid, prompt, subscriber, params.seed)
        req = Request(rid, prompt, ids, params, options, max_new_tokens if not error else 0, subscriber, stream_steps, handle)
        if start:
            req.start = start
        with self.intake:
            self._subscriber_of[rid] = subscriber
            if not error:
                error = self._refusal()
            if not error:
                req.max_canvases = math.ceil(max_new_tokens / self.loaded.canvas_length)
                # 'queued' goes out before step() can see the request (and say 'running').
                self.subscribers.emit(req, request_event(req, Status.QUEUED))
                self._inbox.append(req)
                self.intake.notify_all()
                return handle
        self.lifecycle.finish(req, Status.ERROR, error=error)
        return handle

    def submit_run(self, call: RunRequest, options: RunOptions, subscriber: str | None,
                   stream_steps: bool) -> list[RequestHandle]:
        """Queue a checked call's prompts (prompt i: seed S + i, its first canvas) all or none: holding the
        intake, the next step takes the whole run at once (up to max_num_seqs start together, so step 0 of
        a recording shows every canvas's random start)."""
        settings = call.settings
        with self.intake:
            return [self.submit(p, settings.params.for_prompt(i), settings.max_new_tokens, subscriber, stream_steps,
                                options, call.canvas(i)) for i, p in enumerate(call.prompts)]

    def _refusal(self) -> str:
        if self.refusal:
            return self.refusal
        if len(self._inbox) + len(self.scheduler.waiting) >= self.config.max_waiting:
            return f"the engine queue is full ({self.config.max_waiting} requests waiting); try again later"
        return ""

    def tokenize(self, prompt: str) -> list[int]:
        """The prompt's token ids; safe from any thread."""
        with self.detok.lock:  # fast tokenizers are not safe under concurrent calls
            return self.loaded.encode(prompt)

    def tokenize_text(self, text: str) -> list[int]:
        """Output text's token ids (a start, a pin); safe from any thread."""
        with self.detok.lock:
            return self.loaded.encode_text(text)

    def cancel(self, request_id: int, subscriber: str | None = None, reason: str = "") -> None:
        """Cancel a request: a waiting one never starts, a running one frees its slot next step; its final
        event carries `reason` as its error. With `subscriber`, only a request of that subscriber is cancelled."""
        with self.intake:
            if subscriber is not None and self._subscriber_of.get(int(request_id), subscriber) != subscriber:
                return
            self._cancels[int(request_id)] = reason
            self.intake.notify_all()

    def cancel_subscriber(self, subscriber: str, reason: str = "") -> int:
        """Cancel every request of `subscriber` (a closed browser tab); returns how many."""
        with self.intake:
            ids = [rid for rid, s in self._subscriber_of.items() if s == subscriber]
            self._cancels.update((rid, reason) for rid in ids)
            self.intake.notify_all()
        return len(ids)

    def subscribe(self, subscriber: str | None = None, tile_plans: bool = True, coalesce: bool = True) -> Mailbox:
        """A mailbox of every request's events (or only `subscriber`'s) plus tile plans.

        A subscriber's mailbox gets only the tile plans of steps its requests took part in.
        coalesce=False keeps every step frame (for tests and offline analysis: memory grows
        with a slow reader). `unsubscribe` it when done.
        """
        return self.subscribers.add(subscriber, tile_plans, coalesce)

    def unsubscribe(self, mailbox: Mailbox) -> None:
        self.subscribers.remove(mailbox)

    def has_unfinished(self) -> bool:
        """Anything submitted, queued, running or waiting to be cancelled."""
        with self.intake:
            return bool(self._inbox or self._cancels or self.scheduler.running or self.scheduler.waiting)

    def counts(self) -> tuple[int, int]:
        """(running, waiting) requests."""
        with self.intake:
            return len(self.scheduler.running), len(self.scheduler.waiting) + len(self._inbox)

    @property
    def stats(self) -> dict:
        """The engine's counters, each read from the one part that keeps it."""
        return dict(steps=self.steps, **asdict(self.phases.counts), **asdict(self.lifecycle.counts),
                    **asdict(self.phases.clock.totals))

    def _forget_subscriber(self, request_id: int) -> None:
        with self.intake:
            self._subscriber_of.pop(request_id, None)

    # ------------------------------------------------------------------ the step

    def step(self) -> EngineStep:
        """schedule -> execute -> update, once."""
        with self.lock:
            scheduled = self.schedule()
            executed = self.phases.execute(scheduled.rows)
            self.lifecycle.update(executed)
            self.steps += bool(scheduled.rows)
            self._last = EngineStep(scheduled, executed)
            return self._last

    def schedule(self) -> SchedulerOutput:
        """Phase 1, the only place a request joins, is preempted or is cancelled: take the inbox and the
        cancels, make room for last step's request short of memory, admit into free slots."""
        with self.intake:
            inbox, self._inbox = self._inbox, deque()
            cancels, self._cancels = self._cancels, {}
        self.scheduler.waiting.extend(inbox)
        if cancels:
            running = [r for r in self.scheduler.running.values() if r.id in cancels]
            for req in self.scheduler.remove_waiting(set(cancels)) + running:
                self.lifecycle.finish(req, Status.CANCELLED, error=cancels[req.id])
        preempted = self.lifecycle.make_room(self._last.executed.short, len(self._last.scheduled.rows) == 1)
        admitted = self.lifecycle.admit()
        return SchedulerOutput(self.scheduler.rows(), admitted, preempted)

    # ------------------------------------------------------------------ failures

    def fail_running(self, error: str) -> None:
        """After a failed step: running requests end with `error`; the samplers' state is rebuilt on
        next use (a step that died half-way may have left it inconsistent). Waiting ones stay queued."""
        with self.lock:
            self.end_requests(list(self.scheduler.running.values()), Status.ERROR, error)
            self.scheduler.clear_running()
            self.samplers.drop_all()

    def take_unstarted(self) -> list:
        """Remove and return every queued and just-submitted request (hold `intake` to make this
        one step with whatever else must change with it)."""
        with self.intake:
            stranded = list(self.scheduler.waiting) + list(self._inbox)
            self.scheduler.waiting.clear()
            self._inbox.clear()
        return stranded

    def end_requests(self, requests: list, status: str, error: str) -> None:
        """End `requests` (running ones, or those `take_unstarted` took) with `status` and `error`."""
        for req in requests:
            self.lifecycle.finish(req, status, error=error)

    def cancel_everything(self, reason: str) -> None:
        """End every request with a final 'cancelled' event carrying `reason` (shutdown)."""
        with self.lock:
            with self.intake:
                unfinished = list(self.scheduler.running.values()) + self.take_unstarted()
                self._cancels.clear()
            self.end_requests(unfinished, Status.CANCELLED, reason)
