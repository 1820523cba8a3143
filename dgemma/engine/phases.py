"""The model-side phases of an engine step: encode, decode, sample and emit (docs/design.md).

    encode   prefill admitted prompts together; append last step's converged canvases to their
             request's KV cache; start each next canvas from keyed noise
    decode   every denoising canvas in ONE decoder batch over per-row caches, up to the final
             hidden states; an out-of-memory splits the batch in halves, down to one request
    sample   one tiled sampler step per distinct RunOptions over its rows (the LM head per tile)
    emit     step frames and tile plans; converged canvases commit next step or finish

Out of memory that even one request cannot survive preempts (see `Lifecycle.make_room_for`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

import torch

from dgemma.engine.lifecycle import Lifecycle
from dgemma.engine.output import start_event, step_event, to_host
from dgemma.engine.requests import Request
from dgemma.engine.resident import cache_bytes
from dgemma.engine.timing import ShareClock
from dgemma.engine.samplers import SamplerPool, by_options, canvases, soft_embeds
from dgemma.memory import HostMemory, MemoryDevice
from dgemma.model.runner import Runner
from dgemma.sampling import StepOutput

log = logging.getLogger(__name__)


@dataclass
class DecoderCounts:
    """The decoder batches run and the batches split on out-of-memory, since the engine started."""

    decoder_calls: int = 0
    decoder_splits: int = 0


class ModelPhases:
    def __init__(self, runner: Runner, pool: SamplerPool, memory: MemoryDevice, lifecycle: Lifecycle, pad_id: int):
        self.runner = runner
        self.pool = pool
        self.memory = memory
        self.lifecycle = lifecycle
        self.pad_id = pad_id
        self.counts = DecoderCounts()
        self.clock = ShareClock(runner.device)  # the decoder's and sampler's shares, no sync of their own

    # -- encode

    def encode(self, running: list[Request]) -> None:
        admitted = [r for r in running if r.pending_commit is not None and r.cache is None]
        prefilled: set[int] = set()
        if admitted:
            try:
                caches = self.runner.prefill([r.prompt_ids for r in admitted], self.pad_id)
            except torch.OutOfMemoryError:  # one prompt at a time below, so only the one that does not fit fails
                caches = [None] * len(admitted)
            for req, cache in zip(admitted, caches):
                req.cache = cache
                if cache is not None:
                    prefilled.add(req.id)
        started: list[Request] = []
        for req in running:
            while self.lifecycle.is_running(req) and req.pending_commit is not None:
                try:
                    if req.cache is None:
                        req.cache = self.runner.prefill([req.prompt_ids], self.pad_id)[0]
                    elif req.id not in prefilled:
                        self.runner.append_to_cache(req.cache, torch.tensor(req.pending_commit))
                    req.cache_bytes = self.lifecycle.resident.resize(
                        req.cache_bytes, cache_bytes(req.cache), "kv_caches")
                except torch.OutOfMemoryError as err:
                    # A failed append added nothing (the cache grows only when the forward returns).
                    self.lifecycle.make_room_for(req, str(err), "its KV cache does not fit")
                    continue
                req.pending_commit = None
                self.pool[req.options].start_canvas(req.slot, req.params, req.canvas_index, req.start)
                started.append(req)
        self._emit_starts(started)

    def _emit_starts(self, started: list[Request]) -> None:
        """Step 0 of every canvas started this step: the keyed random tokens it starts from, so a
        page (or a recording) shows the noise before the first denoising step. One host copy."""
        rows = [r for r in started if r.stream_steps and self.lifecycle.is_running(r)]
        if not rows:
            return
        tokens = canvases(self.pool, rows).tolist()
        for req, ids in zip(rows, tokens, strict=True):
            vocab = self.pool[req.options].vocab_size
            self.lifecycle.emit(req, start_event(req, ids, vocab, self.lifecycle.detok))

    # -- decode

    def timed_decode(self, rows: list[Request]) -> tuple[list[Request], torch.Tensor | None]:
        """`decode_splitting_on_oom`, its time charged to every row it decoded (read at the step's
        host copy: no wait for the device here)."""
        started = self.clock.mark()
        rows, hidden = self.decode_splitting_on_oom(rows)
        self.clock.charge(started, self.clock.mark(), rows, "decoder_seconds")
        return rows, hidden

    def decode_splitting_on_oom(self, rows: list[Request]) -> tuple[list[Request], torch.Tensor | None]:
        """Decoder hidden states for `rows`; an out-of-memory splits the batch and retries.
        Returns the surviving rows and their hidden states [n, CL, hidden]."""
        rows, _ = self.lifecycle.still_running(rows)  # a preemption earlier in this split may have taken some
        if not rows:
            return [], None
        try:
            return rows, self._decode_once(rows)
        except torch.OutOfMemoryError as err:
            # Retry only after leaving this block: the exception's traceback holds the failed
            # forward's frames, and with them every activation it had allocated.
            message = str(err)
        if len(rows) == 1:
            if self.lifecycle.make_room_for(rows[0], message, "its decoder step does not fit"):
                return self.decode_splitting_on_oom(rows)
            return [], None
        self.counts.decoder_splits += 1
        log.info("decoder out of memory with %d requests; splitting: %s", len(rows), message)
        half = len(rows) // 2
        left, left_hidden = self.decode_splitting_on_oom(rows[:half])
        right, right_hidden = self.decode_splitting_on_oom(rows[half:])
        parts = [t for t in (left_hidden, right_hidden) if t is not None]
        return left + right, (torch.cat(parts) if parts else None)

    def _decode_once(self, rows: list[Request]) -> torch.Tensor:
        self.counts.decoder_calls += 1
        canvas = canvases(self.pool, rows)
        soft = soft_embeds(self.pool, rows)
        caches = [r.cache for r in rows]
        if isinstance(self.memory, HostMemory):  # no budget: skip the tracker's per-op cost
            return self.runner.decode(canvas, soft, None, caches, hidden_only=True)
        with self.memory.measure():  # virtual budget or CUDA: the decoder's transient counts
            return self.runner.decode(canvas, soft, None, caches, hidden_only=True)

    # -- sample and emit

    def sample_and_emit(self, rows: list[Request], hidden: torch.Tensor) -> None:
        """One sampler step per distinct RunOptions among `rows`, then its events."""
        for index in by_options(rows).values():
            same_hidden = hidden if len(index) == len(rows) else hidden[index]
            # A preemption in another options' step may have taken some of these rows.
            same_rows, same_hidden = self.lifecycle.still_running([rows[i] for i in index], same_hidden)
            if not same_rows:
                continue
            started = self.clock.mark()
            same_rows, out = self._sample(same_rows, same_hidden)
            if out is not None:
                self._emit(same_rows, out, started)
        self.clock.settle()  # a step whose rows all left before their host copy still counts its decoder

    def _sample(self, rows: list[Request], hidden: torch.Tensor) -> tuple[list[Request], StepOutput | None]:
        """The sampler step for `rows` (all of one RunOptions); when even one request's tile does not
        fit, preempt and retry the rows that have not stepped yet (tiles that ran have advanced theirs)."""
        sampler = self.pool[rows[0].options]
        stepped: list[Request] = []
        plan = None
        while rows:
            before = [sampler.steps_done(r.slot) for r in rows]
            try:
                plan = sampler.step(None, [r.slot for r in rows], hidden=hidden).plan
                stepped += rows
                break
            except torch.OutOfMemoryError as err:
                message = str(err)  # retry outside the except block: the traceback holds the failed tile
                failed = getattr(err, "sentence", message), getattr(err, "figures", None)  # a TileOutOfMemory's
            if rows[0].options.fail_on_oom:  # the run fails with the step's sentence and numbers, as asked
                oom = {**(failed[1] or {}), "held": dict(self.lifecycle.resident.by_term)}  # its ledger, drawn
                for req in rows:
                    self.lifecycle.finish(req, "error", error=failed[0], extra=dict(oom=oom))
                return [], None
            moved = [sampler.steps_done(r.slot) > b for r, b in zip(rows, before)]
            stepped += [r for r, m in zip(rows, moved) if m]
            left = [i for i, m in enumerate(moved) if not m]
            self.lifecycle.make_room_for(rows[left[0]], message, "its sampler step does not fit")
            rows, hidden = self.lifecycle.still_running([rows[i] for i in left], hidden[left])
        stepped, _ = self.lifecycle.still_running(stepped)
        if not stepped:
            return [], None
        if plan is not None:  # the call's ledger: what the engine held while it ran
            plan = replace(plan, held=dict(self.lifecycle.resident.by_term))
        return stepped, sampler.outputs([r.slot for r in stepped], plan)

    def _emit(self, rows: list[Request], out: StepOutput, started: object) -> None:
        host = to_host(out)  # waits for the step's end
        self.clock.charge(started, self.clock.mark(), rows, "sampler_seconds")
        self.clock.settle()  # after the host copy: before any row below finishes and reports its shares
        peak = out.plan.peak_transient_bytes if out.plan is not None else 0
        for req in rows:
            req.peak_sampler_bytes = max(req.peak_sampler_bytes, peak)
        life = self.lifecycle
        life.subscribers.emit_plan(out.plan, rows)
        for i, req in enumerate(rows):
            req.steps += 1
            sampler = self.pool[req.options]
            req.predictor_steps += not sampler.swept(req.slot)
            step = sampler.steps_done(req.slot)
            if not host.finite[i]:
                life.finish(req, "error", error=(
                    f"the model produced NaN or infinite logits at canvas {req.canvas_index + 1}, "
                    f"step {step}; this request was stopped"))
                continue
            if req.stream_steps:
                life.emit(req, step_event(req, step, host.draft[i], host.entropy[i], host.accepted[i],
                                          host.mean_entropy[i], bool(host.converged[i]), life.detok))
            if host.converged[i]:
                life.converged(req, host.draft[i])
