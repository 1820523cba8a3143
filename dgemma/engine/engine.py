"""The engine: many concurrent prompts through one model and the tiled sampler, as a stream of events.

Continuous batching in the manner of vLLM's `max_num_seqs`. One engine thread owns the model;
any number of threads `submit`, `cancel` and read events through a thread-safe API. Each engine
step has named phases:

    1. schedule   apply cancellations (slots free at once); admit waiting requests FIFO into
                  free slots, up to max_num_seqs (fewer after a preemption, see below)
    2. encode     prefill admitted prompts (together: runner.prefill); append last step's
                  converged canvases to their request's KV cache (the commit) and start the
                  next canvas from noise
    3. decode     every denoising canvas in ONE decoder batch (runner.py: exact per-row caches),
                  fed the sampler's stored soft embeddings, up to the final hidden states; an
                  out-of-memory splits the batch in halves and retries, down to one request
    4. sample     the tiled sampler's step over all rows: it plans tiles against free memory
                  and applies the LM head per tile, so [n, CL, vocab] logits never exist at once
    5. emit       per-request step frames and the tile plan; converged canvases commit next
                  step, or finish the request (EOS, max_new_tokens)

Out of memory is expected, and an accepted request is not lost to it. When a prefill, a commit,
a decoder call or a sampler call does not fit even for one request, the engine preempts the
newest-admitted running request (vLLM's recompute preemption): its KV cache and slot are freed, it
goes back to the front of the queue, and it later restarts from its prompt. Its randomness is keyed
by (seed, canvas, step), so the restart commits the very same tokens. After a preemption the engine
admits at most as many requests as were left running, plus one for each request that ends, so it
does not refill memory at once and preempt again. Only a request that does not fit even when it
runs alone fails, with one sentence.

Failures stay local: a request whose logits are NaN/inf fails with one sentence while the others
keep running. If the engine thread itself dies, its running requests fail with the reason, waiting
ones stay queued, and the engine restarts itself on a fresh thread (see `restart`), so a server
keeps serving.
"""

from __future__ import annotations

import itertools
import logging
import math
import threading
import time
from collections import deque
from dataclasses import asdict, dataclass, field

import torch

from dgemma.events import Event, RequestEvent, StepEvent, TilePlan
from dgemma.engine.mailbox import Mailbox
from dgemma.memory import HostMemory, MemoryDevice, VirtualDevice, format_bytes, memory_for, parse_size
from dgemma.model.loading import LoadedModel
from dgemma.model.runner import Runner
from dgemma.sampling import SAMPLER_STEPS, LMHead, StepOutput, TiledSampler, build_sampler
from dgemma.sampling import SamplingParams, parse_tiling

log = logging.getLogger(__name__)

FINAL = ("done", "cancelled", "error")


class EngineError(RuntimeError):
    """The engine cannot start (e.g. the memory budget is smaller than the weights)."""


@dataclass(frozen=True)
class EngineConfig:
    max_num_seqs: int = 8  # requests denoising at once (slots)
    tiling: str | int = "auto"  # sampler tiling: auto | off | N requests per tile
    sampler: str = "reference"  # sampler step: reference (eager, the lesson's) | chunked (vocab-streaming)
    memory_budget: str | int | None = None  # CPU: a virtual device; CUDA: a per-process cap
    max_waiting: int = 10_000  # requests queued in total, beyond which submit refuses
    max_new_tokens: int = 4096  # the most one request may ask for
    max_prompt_chars: int = 1_000_000  # longer prompts are refused before tokenizing
    auto_restart: bool = True  # a dead engine thread restarts itself (running requests fail)
    max_restarts: int = 5  # ... at most this many times in a row without a successful step


@dataclass
class Faults:
    """Fault injection for the reliability tests: set attributes from any thread.

    decoder_oom_above: a decoder call with more rows than this raises out-of-memory.
    nan_requests: these request ids get NaN logits (from their next decoder step on).
    crash_steps: the next this-many engine steps raise inside the engine thread.
    """

    decoder_oom_above: int | None = None
    nan_requests: set[int] = field(default_factory=set)
    crash_steps: int = 0


@dataclass
class _Request:
    """Engine-thread state of one request; other threads only see its events."""

    id: int
    prompt: str
    prompt_ids: list[int]
    params: SamplingParams
    max_new_tokens: int
    session: str | None
    stream_steps: bool
    handle: RequestHandle
    max_canvases: int = 1
    status: str = "queued"
    admitted: int = 0  # admission order: the newest-admitted request is preempted first
    slot: int | None = None
    cache: object = None
    cache_bytes: int = 0
    canvas_index: int = 0
    pending_commit: list[int] | None = None  # a converged canvas waiting for the encoder
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    steps: int = 0
    stop_reason: str = ""
    submitted: float = field(default_factory=time.monotonic)
    started: float | None = None
    finished: float | None = None


class RequestHandle:
    """What `submit` returns: this request's own events, its result, and cancel."""

    def __init__(self, engine: Engine, request_id: int, prompt: str, session: str | None, seed: int):
        self.id = request_id
        self.prompt = prompt
        self.session = session
        self.seed = seed
        self._engine = engine
        self._mailbox = Mailbox()
        self._final: RequestEvent | None = None
        self._done = threading.Event()

    def _deliver(self, event: Event) -> None:
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
        self._engine.cancel(self.id)


class Engine:
    """Continuous batching over one loaded model; thread-safe submit / stream / cancel."""

    def __init__(self, loaded: LoadedModel, config: EngineConfig = EngineConfig()):
        if not isinstance(config.max_num_seqs, int) or config.max_num_seqs < 1:
            raise EngineError(f"max_num_seqs must be a whole number >= 1, got {config.max_num_seqs!r}")
        if config.sampler not in SAMPLER_STEPS:
            raise EngineError(f"unknown sampler {config.sampler!r}: choose from {', '.join(SAMPLER_STEPS)}")
        try:
            self.tiling = parse_tiling(config.tiling)
            budget = parse_size(config.memory_budget) if config.memory_budget is not None else None
            self.memory: MemoryDevice = memory_for(loaded.device, budget)
        except ValueError as err:
            raise EngineError(str(err)) from None
        self.loaded = loaded
        self.config = config
        self.tokenizer = loaded.tokenizer
        self.canvas_length = loaded.canvas_length
        self.eos = set(loaded.eos_token_ids)
        self.runner = Runner(loaded.model)
        self.faults = Faults()
        self.default_params = SamplingParams.from_generation_config(
            getattr(loaded.model, "generation_config", None)
        )
        if isinstance(self.memory, VirtualDevice):
            self._reserve(loaded.weight_bytes, "the model weights")

        self._ids = itertools.count(1)
        self._lock = threading.Condition()
        self._inbox: deque[_Request] = deque()  # submitted, not yet seen by the engine thread
        self._cancels: set[int] = set()
        self._waiting: deque[_Request] = deque()  # FIFO, engine thread only
        self._running: dict[int, _Request] = {}  # slot -> request, engine thread only
        self._subscribers: list[tuple[Mailbox, str | None]] = []
        self._sessions: dict[int, str | None] = {}  # request id -> session, for cancel_session
        self._tokenizer_lock = threading.Lock()
        self._pieces: dict[int, str] = {}
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._dead = False  # the thread died and gave up restarting
        self.last_error = ""
        self.deaths = 0
        self._deaths_in_a_row = 0
        self.stats = dict(steps=0, decoder_calls=0, decoder_splits=0, canvases=0, requests_done=0, preemptions=0)
        self._admissions = itertools.count(1)
        self._admit_cap: int | None = None  # running requests allowed after a preemption; None = max_num_seqs
        self._sampler: TiledSampler | None = None
        self._sampler_bytes = 0

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> Engine:
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                return self
            self._stopping = False
            self._dead = False
            self._new_sampler()
            self._thread = threading.Thread(target=self._loop, name="dgemma-engine", daemon=True)
            self._thread.start()
        return self

    def restart(self) -> Engine:
        """Start a fresh engine thread after it gave up (auto_restart off or too many deaths)."""
        return self.start()

    def shutdown(self, timeout: float = 30.0) -> None:
        """Stop the thread; every unfinished request gets a final 'cancelled' event."""
        with self._lock:
            self._stopping = True
            self._lock.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)
        for req in list(self._running.values()) + list(self._waiting) + list(self._inbox):
            self._finish(req, "cancelled", error="the engine shut down")
        self._inbox.clear()
        self._waiting.clear()
        for mailbox, _ in list(self._subscribers):
            mailbox.close()

    def __enter__(self) -> Engine:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.shutdown()

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def health(self) -> dict:
        return dict(
            alive=self.alive,
            last_error=self.last_error,
            deaths=self.deaths,
            running=len(self._running),
            waiting=len(self._waiting) + len(self._inbox),
            max_num_seqs=self.config.max_num_seqs,
            memory=self.memory.name,
            free_bytes=self.memory.free_bytes(),
            **self.stats,
        )

    # ------------------------------------------------------------------ the thread-safe API

    def submit(
        self,
        prompt: str,
        params: SamplingParams | None = None,
        max_new_tokens: int = 64,
        session: str | None = None,
        stream_steps: bool = True,
    ) -> RequestHandle:
        """Queue one prompt. Never raises for bad input: the handle's final event says what was wrong."""
        params = params if params is not None else self.default_params
        rid = next(self._ids)
        handle = RequestHandle(self, rid, prompt if isinstance(prompt, str) else "", session, params.seed)
        error, ids = self._check(prompt, params, max_new_tokens)
        req = _Request(rid, handle.prompt, ids, params, max_new_tokens if not error else 0, session, stream_steps, handle)
        with self._lock:
            self._sessions[rid] = session
        if error:
            self._finish(req, "error", error=error)
            return handle
        req.max_canvases = math.ceil(max_new_tokens / self.canvas_length)
        with self._lock:
            if self._stopping:
                error = "the engine has shut down; this request was not run"
            elif self._dead:
                error = f"the engine stopped after repeated failures ({self.last_error}); restart it"
            elif len(self._inbox) + len(self._waiting) >= self.config.max_waiting:
                error = f"the engine queue is full ({self.config.max_waiting} requests waiting); try again later"
            else:
                # 'queued' goes out before the engine thread can see the request (and say 'running').
                self._emit(req, RequestEvent(rid, "queued", seed=params.seed, prompt=req.prompt))
                self._inbox.append(req)
                self._lock.notify_all()
        if error:
            self._finish(req, "error", error=error)
        return handle

    def cancel(self, request_id: int, session: str | None = None) -> None:
        """Cancel a request: a waiting one never starts, a running one frees its slot next step.
        With `session`, only a request of that session is cancelled (one tab cannot stop another's)."""
        with self._lock:
            if session is not None and self._sessions.get(int(request_id), session) != session:
                return
            self._cancels.add(int(request_id))
            self._lock.notify_all()

    def cancel_session(self, session: str) -> int:
        """Cancel every request of `session` (a closed browser tab); returns how many."""
        with self._lock:
            ids = [rid for rid, s in self._sessions.items() if s == session]
            self._cancels.update(ids)
            self._lock.notify_all()
        return len(ids)

    def subscribe(self, session: str | None = None, tile_plans: bool = True, coalesce: bool = True) -> Mailbox:
        """A mailbox of every request's events (or only `session`'s) plus tile plans.

        A session's mailbox gets only the tile plans of steps its requests took part in.
        coalesce=False keeps every step frame (for tests and offline analysis: memory grows
        with a slow reader). `unsubscribe` it when done.
        """
        mailbox = Mailbox(coalesce=coalesce)
        mailbox.wants_plans = tile_plans
        with self._lock:
            self._subscribers.append((mailbox, session))
        return mailbox

    def unsubscribe(self, mailbox: Mailbox) -> None:
        with self._lock:
            self._subscribers = [(m, s) for m, s in self._subscribers if m is not mailbox]
        mailbox.close()

    def generate(
        self, prompts: list[str], params: list[SamplingParams] | SamplingParams | None = None, max_new_tokens: int = 64
    ) -> list[RequestEvent]:
        """Blocking convenience: submit all prompts, return their final events in input order."""
        if not isinstance(params, list):
            params = [params] * len(prompts)
        self.start()  # a no-op when running; a blocking call must not wait on a stopped engine
        handles = [self.submit(p, q, max_new_tokens, stream_steps=False) for p, q in zip(prompts, params)]
        return [h.result() for h in handles]

    # ------------------------------------------------------------------ checks (caller's thread)

    def _check(self, prompt, params: SamplingParams, max_new_tokens) -> tuple[str, list[int]]:
        """One sentence if the request cannot run, else '' and the prompt's token ids."""
        if not isinstance(prompt, str):
            return f"the prompt must be text, got {type(prompt).__name__}", []
        if not prompt.strip():
            return "the prompt is empty", []
        if len(prompt) > self.config.max_prompt_chars:
            return f"the prompt has {len(prompt)} characters; the limit is {self.config.max_prompt_chars}", []
        try:
            prompt.encode("utf-8")
        except UnicodeEncodeError:
            return "the prompt contains characters that are not valid Unicode (lone surrogates)", []
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            return f"max_new_tokens must be a whole number >= 1, got {max_new_tokens!r}", []
        if max_new_tokens > self.config.max_new_tokens:
            return f"max_new_tokens {max_new_tokens} is above this engine's limit of {self.config.max_new_tokens}", []
        try:
            params.validate()
        except ValueError as err:
            return str(err), []
        with self._tokenizer_lock:  # fast tokenizers are not safe under concurrent calls
            ids = self.loaded.encode(prompt)
        canvases = math.ceil(max_new_tokens / self.canvas_length)
        needed = len(ids) + canvases * self.canvas_length
        if needed > self.loaded.max_positions:
            return (
                f"the prompt ({len(ids)} tokens) plus {canvases} canvas(es) of {self.canvas_length} tokens "
                f"needs {needed} positions but the model has {self.loaded.max_positions}"
            ), []
        return "", ids

    # ------------------------------------------------------------------ the engine thread

    def _loop(self) -> None:
        try:
            while True:
                with self._lock:
                    while not (self._stopping or self._inbox or self._cancels or self._running or self._waiting):
                        self._lock.wait()
                    if self._stopping:
                        return
                    inbox, self._inbox = self._inbox, deque()
                    cancels, self._cancels = self._cancels, set()
                self._waiting.extend(inbox)
                self._apply_cancels(cancels)
                if self._running or self._waiting:
                    self.step()
                    self._deaths_in_a_row = 0
        except BaseException as err:  # noqa: BLE001 - the thread must report any death
            self._die(err)

    def _die(self, err: BaseException) -> None:
        reason = f"{type(err).__name__}: {str(err).strip().splitlines()[0] if str(err).strip() else ''}"
        log.exception("engine thread died: %s", reason)
        self.last_error = reason
        self.deaths += 1
        self._deaths_in_a_row += 1
        for req in list(self._running.values()):
            self._finish(req, "error", error=f"the engine failed while running this request ({reason})")
        if self.config.auto_restart and self._deaths_in_a_row <= self.config.max_restarts:
            # Restart on a fresh thread: waiting requests stay queued and run there.
            self._thread = None
            try:
                self.start()
                return
            except Exception as restart_err:  # noqa: BLE001 - then give up below, loudly
                reason = f"{reason}; restarting failed: {restart_err}"
                self.last_error = reason
        with self._lock:
            self._dead = True  # submit refuses until restart(); nothing may wait forever
            stranded = list(self._waiting) + list(self._inbox)
            self._waiting.clear()
            self._inbox.clear()
        for req in stranded:
            self._finish(req, "error", error=f"the engine stopped ({reason}); this request never started")

    def _new_sampler(self) -> None:
        if self._sampler is not None and isinstance(self.memory, VirtualDevice):
            self.memory.release(self._sampler_bytes)
        loaded = self.loaded
        # The sampler applies the LM head per tile: the decoder hands it hidden states, so the
        # [n, CL, vocab] logits exist one tile at a time (the point of tiling at a 262k vocab).
        head = LMHead(loaded.model.lm_head.weight, loaded.model.final_logit_softcapping)
        self._sampler = build_sampler(
            self.config.sampler,
            self.config.max_num_seqs,
            loaded.canvas_length,
            loaded.vocab_size,
            loaded.embed_weight,
            loaded.embed_scale,
            memory=self.memory,
            tiling=self.tiling,
            lm_head=head,
        )
        self._sampler_bytes = sum(
            t.untyped_storage().nbytes() for t in vars(self._sampler).values() if isinstance(t, torch.Tensor)
        )
        if isinstance(self.memory, VirtualDevice):
            self._reserve(self._sampler_bytes, "the sampler's per-slot state")
        # A fresh sampler has no running requests (after a death they were failed already).
        self._running.clear()
        self._free_slots = list(range(self.config.max_num_seqs))
        self._admit_cap = None

    def step(self) -> None:
        """One engine step: schedule, encode, decode, sample, emit."""
        if self.faults.crash_steps > 0:
            self.faults.crash_steps -= 1
            raise RuntimeError("injected engine crash")
        self._schedule()
        self._encode()
        rows = [req for _, req in sorted(self._running.items())]
        if not rows:
            return
        rows, hidden = self._decode(rows)
        rows, hidden = self._still_running(rows, hidden)  # a preemption may have taken a decoded row
        if rows:
            self._sample_and_emit(rows, hidden)
        self.stats["steps"] += 1

    # -- phase 1: schedule

    def _apply_cancels(self, cancels: set[int]) -> None:
        if not cancels:
            return
        for req in [r for r in self._waiting if r.id in cancels]:
            self._waiting.remove(req)
            self._finish(req, "cancelled")
        for req in [r for r in self._running.values() if r.id in cancels]:
            self._finish(req, "cancelled")

    def _schedule(self) -> None:
        while self._waiting and self._free_slots and (self._admit_cap is None or len(self._running) < self._admit_cap):
            req = self._waiting.popleft()
            req.slot = self._free_slots.pop(0)
            self._running[req.slot] = req
            req.status = "running"
            req.admitted = next(self._admissions)
            req.started = time.monotonic()
            req.pending_commit = req.prompt_ids  # phase 2 prefills it (no cache yet)
            self._emit(req, RequestEvent(req.id, "running", seed=req.params.seed, prompt=req.prompt))

    # -- phase 2: encode

    def _encode(self) -> None:
        admitted = [r for r in self._running.values() if r.pending_commit is not None and r.cache is None]
        prefilled: set[int] = set()
        if admitted:
            try:
                caches = self.runner.prefill([r.prompt_ids for r in admitted], self.tokenizer.pad_token_id or 0)
            except torch.OutOfMemoryError:  # one prompt at a time below, so only the one that does not fit fails
                caches = [None] * len(admitted)
            for req, cache in zip(admitted, caches):
                req.cache = cache
                if cache is not None:
                    prefilled.add(req.id)
        for req in list(self._running.values()):
            while self._is_running(req) and req.pending_commit is not None:
                try:
                    if req.cache is None:
                        req.cache = self.runner.prefill([req.prompt_ids], self.tokenizer.pad_token_id or 0)[0]
                    elif req.id not in prefilled:
                        self.runner.encode(req.cache, torch.tensor(req.pending_commit))
                    self._account_cache(req)
                except torch.OutOfMemoryError as err:
                    # A failed encode appended nothing (the cache grows only when the forward returns).
                    self._relieve(req, str(err), "its KV cache does not fit")
                    continue
                req.pending_commit = None
                self._sampler.start_canvas(req.slot, req.params, req.canvas_index)

    def _account_cache(self, req: _Request) -> None:
        if not isinstance(self.memory, VirtualDevice):
            return
        nbytes = sum(
            layer.keys.untyped_storage().nbytes() + layer.values.untyped_storage().nbytes()
            for layer in req.cache.layers
            if getattr(layer, "keys", None) is not None
        )
        if nbytes > req.cache_bytes:
            self.memory.reserve(nbytes - req.cache_bytes, f"request {req.id}'s KV cache")
        else:
            self.memory.release(req.cache_bytes - nbytes)
        req.cache_bytes = nbytes

    # -- phase 3: decode

    def _decode(self, rows: list[_Request]) -> tuple[list[_Request], torch.Tensor | None]:
        """Decoder hidden states for `rows`; an out-of-memory splits the batch and retries.
        Returns the surviving rows and their hidden states [n, CL, hidden]."""
        rows, _ = self._still_running(rows)  # a preemption earlier in this split may have taken some
        if not rows:
            return [], None
        try:
            return rows, self._decode_once(rows)
        except torch.OutOfMemoryError as err:
            # Retry only after leaving this block: the exception's traceback holds the failed
            # forward's frames, and with them every activation it had allocated.
            message = str(err)
        if len(rows) == 1:
            if self._relieve(rows[0], message, "its decoder step does not fit"):
                return self._decode(rows)
            return [], None
        self.stats["decoder_splits"] += 1
        log.info("decoder out of memory with %d requests; splitting: %s", len(rows), message)
        half = len(rows) // 2
        left, left_hidden = self._decode(rows[:half])
        right, right_hidden = self._decode(rows[half:])
        parts = [t for t in (left_hidden, right_hidden) if t is not None]
        return left + right, (torch.cat(parts) if parts else None)

    def _decode_once(self, rows: list[_Request]) -> torch.Tensor:
        self.stats["decoder_calls"] += 1
        limit = self.faults.decoder_oom_above
        if limit is not None and len(rows) > limit:
            raise torch.OutOfMemoryError(f"injected out of memory: decoder batch of {len(rows)} > {limit}")
        slots = [r.slot for r in rows]
        canvases = self._sampler.canvas[slots]
        soft = self._sampler.soft_embeds(slots)  # zeros on a canvas's first step
        caches = [r.cache for r in rows]
        if isinstance(self.memory, HostMemory):  # no budget: skip the tracker's per-op cost
            hidden = self.runner.decode(canvases, soft, None, caches, hidden_only=True)
        else:
            with self.memory.measure():  # virtual budget or CUDA: the decoder's transient counts
                hidden = self.runner.decode(canvases, soft, None, caches, hidden_only=True)
        if self.faults.nan_requests:
            for i, r in enumerate(rows):
                if r.id in self.faults.nan_requests:
                    hidden[i] = float("nan")
        return hidden

    # -- phases 4 and 5: sample, emit

    def _sample(self, rows: list[_Request], hidden: torch.Tensor) -> tuple[list[_Request], StepOutput | None]:
        """The sampler step for `rows`; when even one request's tile does not fit, preempt and retry
        the rows that have not stepped yet (tiles that ran have already advanced their requests)."""
        stepped: list[_Request] = []
        plan = None
        while rows:
            before = [self._sampler.steps_done(r.slot) for r in rows]
            try:
                plan = self._sampler.step(None, [r.slot for r in rows], hidden=hidden).plan
                stepped += rows
                break
            except torch.OutOfMemoryError as err:
                message = str(err)  # retry outside the except block: the traceback holds the failed tile
            moved = [self._sampler.steps_done(r.slot) > b for r, b in zip(rows, before)]
            stepped += [r for r, m in zip(rows, moved) if m]
            left = [i for i, m in enumerate(moved) if not m]
            self._relieve(rows[left[0]], message, "its sampler step does not fit")
            rows, hidden = self._still_running([rows[i] for i in left], hidden[left])
        stepped, _ = self._still_running(stepped)
        if not stepped:
            return [], None
        return stepped, self._sampler.outputs([r.slot for r in stepped], plan)

    def _sample_and_emit(self, rows: list[_Request], hidden: torch.Tensor) -> None:
        rows, out = self._sample(rows, hidden)
        del hidden
        if out is None:
            return
        draft, entropy, accepted, mean, converged, finite = _to_host(out)
        want = [r.stream_steps for r in rows]
        self._emit_plan(out.plan, rows)
        for i, req in enumerate(rows):
            req.steps += 1
            if not finite[i]:
                self._finish(req, "error", error=(
                    f"the model produced NaN or infinite logits at canvas {req.canvas_index + 1}, "
                    f"step {self._sampler.steps_done(req.slot)}; this request was stopped"))
                continue
            if want[i]:
                self._emit(req, StepEvent(
                    request_id=req.id,
                    canvas_index=req.canvas_index,
                    step=self._sampler.steps_done(req.slot),
                    max_steps=req.params.max_denoising_steps,
                    token_ids=tuple(draft[i]),
                    pieces=tuple(self._piece(t) for t in draft[i]),
                    entropy=tuple(entropy[i]),
                    accepted=tuple(accepted[i]),
                    mean_entropy=mean[i],
                    confidence_threshold=req.params.confidence_threshold,
                    converged=bool(converged[i]),
                ))
            if converged[i]:
                self._converged(req, draft[i])

    def _converged(self, req: _Request, canvas: list[int]) -> None:
        self.stats["canvases"] += 1
        logprobs = self._sampler.take_logprobs(req.slot).tolist()
        cut = next((j for j, t in enumerate(canvas) if t in self.eos), None)
        keep = canvas if cut is None else canvas[:cut]
        req.tokens.extend(keep)
        req.logprobs.extend(logprobs[: len(keep)])
        req.canvas_index += 1
        if cut is not None or len(req.tokens) >= req.max_new_tokens or req.canvas_index >= req.max_canvases:
            req.stop_reason = "eos" if cut is not None else "length"
            del req.tokens[req.max_new_tokens :]
            del req.logprobs[req.max_new_tokens :]
            self._finish(req, "done")
            return
        req.pending_commit = canvas  # phase 2 of the next step appends it to the cache
        self._emit(req, RequestEvent(
            req.id, "committed", text=self._text(req.tokens), token_ids=tuple(req.tokens),
            canvases=req.canvas_index, steps=req.steps, seed=req.params.seed, prompt=req.prompt,
        ))

    def _finish(self, req: _Request, status: str, error: str = "") -> None:
        """Final event for `req`; frees its slot and cache at once."""
        if req.status in FINAL:
            return
        req.status = status
        req.finished = time.monotonic()
        if self._release(req) and self._admit_cap is not None:
            # Memory came back: admit one more than before (the cap lifts when it reaches max_num_seqs).
            self._admit_cap += 1
            if self._admit_cap >= self.config.max_num_seqs:
                self._admit_cap = None
        if status == "done":
            self.stats["requests_done"] += 1
        latency = req.finished - req.submitted
        self._emit(req, RequestEvent(
            req.id, status, text=self._text(req.tokens), token_ids=tuple(req.tokens), canvases=req.canvas_index,
            steps=req.steps, error=error, seed=req.params.seed, prompt=req.prompt,
            extra=dict(stop_reason=req.stop_reason, latency_s=latency, logprobs=list(req.logprobs),
                       queued_s=(req.started or req.finished) - req.submitted),
        ))
        with self._lock:
            self._sessions.pop(req.id, None)

    # -- memory pressure

    def _is_running(self, req: _Request) -> bool:
        return req.slot is not None and self._running.get(req.slot) is req

    def _still_running(
        self, rows: list[_Request], hidden: torch.Tensor | None = None
    ) -> tuple[list[_Request], torch.Tensor | None]:
        keep = [i for i, r in enumerate(rows) if self._is_running(r)]
        if hidden is not None and len(keep) < len(rows):
            hidden = hidden[keep]
        return [rows[i] for i in keep], hidden

    def _relieve(self, req: _Request, message: str, what: str) -> bool:
        """`req` ran out of memory even on its own. Preempt the newest-admitted running request (`req`
        itself if it is the newest) to make room; True when `req` still runs and should retry. With
        no other request to preempt, `req` cannot fit at all and fails with one sentence."""
        if len(self._running) == 1:
            self._finish(req, "error", error=_oom_sentence(message, f"{what} even with no other request running"))
            return False
        victim = max(self._running.values(), key=lambda r: r.admitted)
        self._preempt(victim, _oom_sentence(message, what))
        return victim is not req

    def _preempt(self, req: _Request, reason: str) -> None:
        """Free a running request's memory and queue it first, to restart from its prompt later."""
        self._release(req)
        req.status = "queued"
        req.canvas_index, req.steps, req.stop_reason = 0, 0, ""
        req.tokens, req.logprobs, req.pending_commit = [], [], None
        self._waiting.appendleft(req)
        self._admit_cap = len(self._running)  # what fits now; each request that ends adds one
        self.stats["preemptions"] += 1
        log.info("preempted request %d (%d running): %s", req.id, len(self._running), reason)
        self._emit(req, RequestEvent(
            req.id, "queued", seed=req.params.seed, prompt=req.prompt,
            extra=dict(preempted=f"preempted to free memory ({reason}); it restarts with the same seed, "
                                 "so its tokens will be the same"),
        ))

    def _release(self, req: _Request) -> bool:
        """Give back `req`'s slot, sampler state and KV cache; True if it held a slot."""
        held = self._is_running(req)
        if held:
            del self._running[req.slot]
            if self._sampler is not None:
                self._sampler.free(req.slot)
            self._free_slots.append(req.slot)
            self._free_slots.sort()
        req.slot = None
        req.cache = None
        if req.cache_bytes and isinstance(self.memory, VirtualDevice):
            self.memory.release(req.cache_bytes)
        req.cache_bytes = 0
        return held

    # -- events

    def _emit(self, req: _Request, event: Event) -> None:
        req.handle._deliver(event)
        with self._lock:
            subscribers = list(self._subscribers)
        for mailbox, session in subscribers:
            if session is None or session == req.session:
                mailbox.put(event)

    def _emit_plan(self, plan: TilePlan | None, rows: list[_Request]) -> None:
        if plan is None:
            return
        with self._lock:
            subscribers = list(self._subscribers)
        sessions = {r.session for r in rows}
        for mailbox, session in subscribers:
            if getattr(mailbox, "wants_plans", True) and (session is None or session in sessions):
                mailbox.put(plan)

    def _piece(self, token: int) -> str:
        piece = self._pieces.get(token)
        if piece is None:
            with self._tokenizer_lock:
                piece = self._pieces[token] = self.tokenizer.decode([token])
        return piece

    def _text(self, tokens: list[int]) -> str:
        with self._tokenizer_lock:
            return self.tokenizer.decode(tokens, skip_special_tokens=True)

    def _reserve(self, nbytes: int, what: str) -> None:
        """Hold long-lived bytes (weights, sampler state) on the virtual device, or refuse to start."""
        try:
            self.memory.reserve(nbytes, what)
        except torch.OutOfMemoryError:
            raise EngineError(
                f"the memory budget of {format_bytes(self.memory.capacity_bytes())} is too small for "
                f"{what} ({format_bytes(nbytes)}, {format_bytes(self.memory.free_bytes())} left)"
            ) from None


def _to_host(out) -> tuple[list, list, list, list, list, list]:
    """The step's outputs as Python lists in ONE device->host copy (one sync per step on CUDA):
    the frames and the convergence decisions need them. Token ids are exact in float64."""
    n, cl = out.draft.shape
    packed = torch.cat(
        [out.draft.double(), out.entropy.double(), out.accepted.double(),
         torch.stack([out.mean_entropy.double(), out.converged.double(), out.finite.double()], dim=1)],
        dim=1,
    ).cpu()
    draft = packed[:, :cl].long().tolist()
    entropy = packed[:, cl : 2 * cl].float().tolist()
    accepted = packed[:, 2 * cl : 3 * cl].bool().tolist()
    mean, converged, finite = packed[:, 3 * cl :].unbind(1)
    return draft, entropy, accepted, mean.float().tolist(), converged.bool().tolist(), finite.bool().tolist()


def _oom_sentence(err: BaseException | str, what: str) -> str:
    first = str(err).strip().splitlines()[0] if str(err).strip() else "out of memory"
    return f"out of memory: {what} ({first})"


def plan_dict(plan: TilePlan) -> dict:
    """A tile plan as plain JSON-able data."""
    return asdict(plan)

