"""What happens to a request: admitted, preempted (the schedule's), a step folded in, a canvas
committed, finished (the update's).

Each transition frees what it must (slot, sampler state, KV cache) and emits its event.
Out of memory for one request preempts the newest-admitted one (docs/design.md, "The engine").
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from dgemma.events import Status
from dgemma.engine.output import Detokenizer, Subscribers, request_event, start_event, step_event
from dgemma.engine.phases import ExecuteOutput, ShortOfMemory
from dgemma.engine.requests import FINAL, Request
from dgemma.engine.resident import Resident
from dgemma.engine.samplers import SamplerPool
from dgemma.engine.scheduler import Scheduler
from dgemma.errors import first_line
from dgemma.metrics import Work, figures

log = logging.getLogger(__name__)


def oom_sentence(err: BaseException | str, what: str) -> str:
    first = first_line(err) if str(err).strip() else "out of memory"
    return f"out of memory: {what} ({first})"


@dataclass
class RequestCounts:
    """Canvases committed, requests done and preemptions, since the engine started."""

    canvases: int = 0
    requests_done: int = 0
    preemptions: int = 0


class Lifecycle:
    def __init__(self, scheduler: Scheduler, pool: SamplerPool, resident: Resident, subscribers: Subscribers,
                 detok: Detokenizer, eos: set[int], forget_subscriber: Callable[[int], None], pad_id: int | None = None):
        self.scheduler = scheduler
        self.pool = pool
        self.resident = resident
        self.subscribers = subscribers
        self.detok = detok
        self.eos = eos
        self.counts = RequestCounts()
        self._forget_subscriber = forget_subscriber
        self.pad_id = pad_id

    def admit(self) -> list[Request]:
        """Waiting requests into free slots (their prompts are prefilled by execute); returns them."""
        admitted = self.scheduler.admit()
        for req in admitted:
            req.started = time.monotonic()
            req.pending_commit = req.prompt_ids
            try:
                self.pool.get(req.options, req.slot)
            except torch.OutOfMemoryError as err:
                self.finish(req, Status.ERROR, error=oom_sentence(err, "its sampler's per-slot state does not fit"))
                continue
            self.subscribers.emit(req, request_event(req, Status.RUNNING))
        return [r for r in admitted if r.status == Status.RUNNING]

    def make_room(self, shortfalls: list[ShortOfMemory], alone: bool) -> list[Request]:
        """For last step's first request short of memory: preempt the newest-admitted (maybe that one) and
        let it retry, or fail it with one sentence if it ran `alone`. Returns the preempted."""
        short = next((s for s in shortfalls if self.scheduler.is_running(s.request)), None)
        if short is None or (not alone and len(self.scheduler.running) == 1):  # the others ended: room to retry
            return []
        if alone:
            self.finish(short.request, Status.ERROR, error=oom_sentence(
                short.message, f"{short.what} even with no other request running"))
            return []
        victim = self.scheduler.victim()
        self.preempt(victim, oom_sentence(short.message, short.what))
        return [victim]

    def update(self, executed: ExecuteOutput) -> None:
        """Fold a step's outputs into its requests and emit their events, in the order they happened."""
        for req, tokens in executed.starts:
            self.subscribers.emit(req, start_event(req, tokens, self.pool[req.options].vocab_size, self.detok))
        for out in executed.sampled:
            self.subscribers.emit_plan(out.plan, out.rows)
            for i, req in enumerate(out.rows):
                if out.error:  # the call ran out of memory under fail_on_oom
                    self.finish(req, Status.ERROR, error=out.error, extra=dict(oom=out.oom))
                    continue
                req.peak_sampler_bytes = max(req.peak_sampler_bytes, out.plan.peak_transient_bytes if out.plan else 0)
                req.steps += 1
                req.predictor_steps += not out.swept[i]
                if not out.host.finite[i]:
                    self.finish(req, Status.ERROR, error=(
                        f"the model produced NaN or infinite logits at canvas {req.canvas_index + 1}, "
                        f"step {out.steps[i]}; this request was stopped"))
                    continue
                if req.stream_steps:
                    self.subscribers.emit(req, step_event(req, out.steps[i], out.host.draft[i], out.host.entropy[i],
                                                          out.host.accepted[i], out.host.mean_entropy[i],
                                                          bool(out.host.converged[i]), self.detok))
                if out.host.converged[i]:
                    self.converged(req, out.host.draft[i])

    def converged(self, req: Request, canvas: list[int]) -> None:
        """A canvas converged: keep its tokens up to EOS; finish, or commit it next step."""
        self.counts.canvases += 1
        logprobs = self.pool[req.options].take_logprobs(req.slot).tolist()
        cut = next((j for j, t in enumerate(canvas) if t in self.eos), None)
        keep = canvas if cut is None else canvas[:cut]
        # transformers' tokens_per_forward counts a canvas up to and including EOS, pad tokens excluded.
        req.canvas_tokens += sum(t != self.pad_id for t in (canvas if cut is None else canvas[: cut + 1]))
        req.tokens.extend(keep)
        req.logprobs.extend(logprobs[: len(keep)])
        req.canvas_index += 1
        if cut is not None or len(req.tokens) >= req.max_new_tokens or req.canvas_index >= req.max_canvases:
            req.stop_reason = "eos" if cut is not None else "length"
            del req.tokens[req.max_new_tokens :]
            del req.logprobs[req.max_new_tokens :]
            self.finish(req, Status.DONE)
            return
        req.pending_commit = canvas  # the next step's encode appends it to the cache
        # The page shows each committed token's logprob on hover.
        self.subscribers.emit(req, request_event(req, Status.COMMITTED, self.detok, extra=dict(logprobs=list(req.logprobs))))

    def finish(self, req: Request, status: str, error: str = "", extra: dict | None = None) -> None:
        """Final event for `req` (a cancel's reason goes in `error`, more about it in `extra`); frees
        its slot and cache at once."""
        if req.status in FINAL:
            return
        req.status = status
        finished = time.monotonic()
        self.release(req, ended=True)
        if status == Status.DONE:
            self.counts.requests_done += 1
        self.subscribers.emit(req, request_event(req, status, self.detok, error=error, extra=dict(
            stop_reason=req.stop_reason, latency_s=finished - req.submitted, logprobs=list(req.logprobs),
            queued_s=(req.started or finished) - req.submitted, metrics=request_figures(req, finished), **(extra or {}))))
        self._forget_subscriber(req.id)

    def release(self, req: Request, ended: bool) -> None:
        """Give back `req`'s slot, sampler state and KV cache."""
        slot = req.slot
        if self.scheduler.release(req, ended):
            self.pool.free(req.options, slot)
        req.cache = None
        req.cache_bytes = self.resident.resize(req.cache_bytes, 0, "kv_caches")

    def preempt(self, req: Request, reason: str) -> None:
        """Free a running request's memory and queue it first, to restart from its prompt later."""
        self.release(req, ended=False)
        req.restart_from_prompt()
        self.scheduler.requeue_first(req)
        self.counts.preemptions += 1
        log.info("preempted request %d (%d running): %s", req.id, len(self.scheduler.running), reason)
        self.subscribers.emit(req, request_event(req, Status.QUEUED, extra=dict(
            preempted=f"preempted to free memory ({reason}); it restarts with the same seed, "
                      "so its tokens will be the same")))


def request_figures(req: Request, finished: float) -> dict:
    """The quoted figures of a request that ended at `finished` (dgemma/metrics.py)."""
    return figures(Work(
        tokens=len(req.tokens), canvas_tokens=req.canvas_tokens, steps=req.steps, canvases=req.canvas_index,
        seconds=finished - (req.started or finished), decoder_seconds=req.decoder_seconds,
        sampler_seconds=req.sampler_seconds, peak_sampler_bytes=req.peak_sampler_bytes,
        predictor_steps=req.predictor_steps, scheduler=req.params.scheduler.name,
    ))  # fmt: skip
