"""A request's life inside the engine: its state, the caller's handle, and the room its prompt needs.

`check_request` runs in the caller's thread at submit (the call's values were checked at the door); `Request`
is touched only by the thread running `EngineCore.step`; `RequestHandle` is what the caller keeps: its events, result, cancel.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from dgemma.engine.mailbox import Mailbox
from dgemma.events import FINAL, Event, RequestEvent, Status
from dgemma.sampling import RunOptions, SamplingParams
from dgemma.sampling.start import CanvasStart


@dataclass
class Request:
    """Engine-side state of one request; other threads only see its events."""

    id: int
    prompt: str
    prompt_ids: list[int]
    params: SamplingParams
    options: RunOptions
    max_new_tokens: int
    subscriber: str | None
    stream_steps: bool
    handle: RequestHandle
    max_canvases: int = 1
    start: CanvasStart = field(default_factory=CanvasStart)  # the first canvas's start tokens and pins
    status: Status = Status.QUEUED
    admitted: int = 0  # admission order: the newest-admitted request is preempted first
    slot: int | None = None
    cache: object = None  # its KV cache (a DynamicCache) while it holds a slot
    cache_bytes: int = 0
    canvas_index: int = 0
    pending_commit: list[int] | None = None  # a converged canvas (or the prompt) for the encoder; [] once in the cache
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    steps: int = 0  # decoder forwards, all canvases (a corrector sweep is one)
    predictor_steps: int = 0  # the scheduler's steps among them (steps less corrector sweeps)
    stop_reason: str = ""
    submitted: float = field(default_factory=time.monotonic)
    started: float | None = None
    # The figures people quote (dgemma/metrics.py): what its committed canvases held, as
    # transformers counts it (up to and including EOS, pad excluded), and the time and peak sampler
    # memory of the steps it took part in.
    canvas_tokens: int = 0
    decoder_seconds: float = 0.0
    sampler_seconds: float = 0.0
    peak_sampler_bytes: int = 0

    def restart_from_prompt(self) -> None:
        """Forget all progress (a preempted request recomputes; its keyed randomness repeats)."""
        self.status = Status.QUEUED
        self.canvas_index, self.steps, self.predictor_steps, self.stop_reason = 0, 0, 0, ""
        self.tokens, self.logprobs, self.pending_commit = [], [], None
        self.canvas_tokens, self.decoder_seconds, self.sampler_seconds = 0, 0.0, 0.0


class RequestHandle:
    """What `submit` returns: this request's own events, its result, and cancel."""

    def __init__(self, cancel: Callable[[int], None], request_id: int, prompt: str, subscriber: str | None, seed: int):
        self.id = request_id
        self.prompt = prompt
        self.subscriber = subscriber
        self.seed = seed
        self._cancel = cancel
        self._mailbox = Mailbox()
        self._final: RequestEvent | None = None
        self._done = threading.Event()

    def deliver(self, event: Event) -> None:
        """Called by the engine: queue `event`; a final one closes the handle."""
        self._mailbox.put(event)
        if isinstance(event, RequestEvent) and event.status in FINAL:
            self._final = event
            self._done.set()
            self._mailbox.close()

    def poll(self, timeout: float | None = 0.0) -> list[Event]:
        """This request's events since the last poll (step frames may be coalesced)."""
        return self._mailbox.poll(timeout)

    def events(self, timeout: float | None = None):
        """Iterate this request's events until its final one (done, cancelled or error)."""
        while True:
            batch = self._mailbox.poll(timeout)
            yield from batch
            if not batch and (self._mailbox.closed or timeout is not None):
                return

    def result(self, timeout: float | None = None) -> RequestEvent:
        """Block until the request finished; its final RequestEvent (never dropped)."""
        if not self._done.wait(timeout):
            raise TimeoutError(f"request {self.id} did not finish within {timeout} s")
        return self._final

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def cancel(self) -> None:
        self._cancel(self.id)


@dataclass(frozen=True)
class RequestLimits:
    """The model's sizes a prompt's tokens and its canvases must fit in."""

    canvas_length: int
    max_positions: int


TYPES = (("prompt", str), ("params", SamplingParams), ("options", RunOptions), ("max_new_tokens", int))


def check_request(prompt: str, params: SamplingParams, options: RunOptions, max_new_tokens: int, limits: RequestLimits,
                  encode: Callable[[str], list[int]]) -> tuple[str, list[int]]:
    """The prompt's token ids and '', or one sentence when the model has no room for them and the canvases
    asked for: the model's fact, known once tokenized. Every value was checked at the one door
    (dgemma/settings.py's `make_request`); here only their types are asserted: TypeError, the caller's bug."""
    for (name, kind), value in zip(TYPES, (prompt, params, options, max_new_tokens), strict=True):
        if not isinstance(value, kind) or isinstance(value, bool):
            raise TypeError(f"{name} must be {kind.__name__}, got {type(value).__name__}")
    ids = encode(prompt)
    canvases = math.ceil(max_new_tokens / limits.canvas_length)
    needed = len(ids) + canvases * limits.canvas_length
    if needed > limits.max_positions:
        return (
            f"the prompt ({len(ids)} tokens) plus {canvases} canvas(es) of {limits.canvas_length} tokens "
            f"needs {needed} positions but the model has {limits.max_positions}"
        ), []
    return "", ids
