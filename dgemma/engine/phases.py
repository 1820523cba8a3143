"""Phase 2 of an engine step, execute: encode, decode and sample exactly the rows the schedule gave
(docs/architecture.md draws the phases). Nothing here admits, ends or preempts a request or asks who
runs: one that cannot run even alone is reported (`ShortOfMemory`) for the next schedule. The outputs
are host values (no tensor outlives the step) that phase 3, `Lifecycle.update`, folds in.
"""

from __future__ import annotations

import logging
from contextlib import nullcontext
from dataclasses import dataclass, field, replace

import torch

from dgemma.engine.output import HostStep, to_host
from dgemma.engine.requests import Request
from dgemma.engine.resident import Resident, cache_bytes
from dgemma.engine.samplers import SamplerPool, by_options, canvases, soft_embeds
from dgemma.engine.timing import ShareClock
from dgemma.events import TilePlan
from dgemma.memory import HostMemory, MemoryDevice
from dgemma.model.runner import Runner

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ShortOfMemory:
    """A request that did not fit even on its own: the next schedule makes room (or fails it, if it ran alone)."""

    request: Request
    message: str  # the out-of-memory error's text
    what: str  # what did not fit, in the words of the request's error or preemption


@dataclass(frozen=True)
class SamplerOutput:
    """One sampler call over one RunOptions' rows, on the host; `error`: out of memory under fail_on_oom."""

    rows: list[Request]
    host: HostStep | None = None
    plan: TilePlan | None = None
    steps: list[int] = field(default_factory=list)  # each row's steps done on its canvas, this one included
    swept: list[bool] = field(default_factory=list)  # this step was a corrector sweep, not a predictor step
    error: str = ""
    oom: dict | None = None


@dataclass
class ExecuteOutput:
    """What the model and the sampler did this step, in the order it happened."""

    starts: list[tuple[Request, list[int]]] = field(default_factory=list)  # canvases started, streamed: step 0
    decoded: list[Request] = field(default_factory=list)  # the decoder batch's rows
    sampled: list[SamplerOutput] = field(default_factory=list)
    short: list[ShortOfMemory] = field(default_factory=list)


@dataclass
class DecoderCounts:
    """The decoder batches run and the batches split on out-of-memory, since the engine started."""

    decoder_calls: int = 0
    decoder_splits: int = 0


class ModelPhases:
    """The one owner of the model's `Runner`."""

    def __init__(self, runner: Runner, pool: SamplerPool, memory: MemoryDevice, resident: Resident, pad_id: int):
        self.runner = runner
        self.pool = pool
        self.memory = memory
        self.resident = resident
        self.pad_id = pad_id
        self.counts = DecoderCounts()
        self.clock = ShareClock(runner.device)  # the decoder's and sampler's shares, no sync of their own

    def execute(self, rows: list[Request]) -> ExecuteOutput:
        """Encode, decode and sample `rows` (every running request, in slot order)."""
        out = ExecuteOutput()
        ready = self.encode(rows, out)
        if ready:
            started = self.clock.mark()
            out.decoded, hidden = self.decode(ready, out)
            self.clock.charge(started, self.clock.mark(), out.decoded, "decoder_seconds")  # read at a host copy
            for index in by_options(out.decoded).values():
                same_hidden = hidden if len(index) == len(out.decoded) else hidden[index]
                self.sample([out.decoded[i] for i in index], same_hidden, out)
        self.clock.settle()  # a step none of whose rows sampled still counts its decoder
        return out

    def encode(self, rows: list[Request], out: ExecuteOutput) -> list[Request]:
        """Bring each row's KV cache up to date and start its canvas; returns the rows ready to decode.
        `pending_commit`: tokens for the cache, [] once they are in it (and the canvas not yet started)."""
        admitted = [r for r in rows if r.cache is None]
        if admitted:
            try:
                caches = self.runner.prefill([r.prompt_ids for r in admitted], self.pad_id)
            except torch.OutOfMemoryError:  # one prompt at a time below, so only the one that does not fit fails
                caches = []
            for req, cache in zip(admitted, caches):
                req.cache, req.pending_commit = cache, []
        ready, started = [], []  # of Request
        for req in rows:
            if req.pending_commit is not None:
                try:
                    if req.cache is None:
                        req.cache = self.runner.prefill([req.prompt_ids], self.pad_id)[0]
                    elif req.pending_commit:
                        self.runner.append_to_cache(req.cache, torch.tensor(req.pending_commit))
                    req.pending_commit = []  # in the cache (a failed forward adds nothing): not appended twice
                    req.cache_bytes = self.resident.resize(req.cache_bytes, cache_bytes(req.cache), "kv_caches")
                except torch.OutOfMemoryError as err:
                    out.short.append(ShortOfMemory(req, str(err), "its KV cache does not fit"))
                    continue
                req.pending_commit = None
                self.pool[req.options].start_canvas(req.slot, req.params, req.canvas_index, req.start)
                started.append(req)
            ready.append(req)
        # Step 0 of every canvas started: the keyed random tokens it starts from, in one host copy.
        streamed = [r for r in started if r.stream_steps]
        if streamed:
            out.starts = list(zip(streamed, canvases(self.pool, streamed).tolist(), strict=True))
        return ready

    def decode(self, rows: list[Request], out: ExecuteOutput) -> tuple[list[Request], torch.Tensor | None]:
        """Decoder hidden states for `rows`; an out-of-memory splits the batch and retries.
        Returns the rows decoded and their hidden states [n, CL, hidden]."""
        try:
            return rows, self._decode_once(rows)
        except torch.OutOfMemoryError as err:
            # Retry only after leaving this block: the exception's traceback holds the failed
            # forward's frames, and with them every activation it had allocated.
            message = str(err)
        if len(rows) == 1:
            out.short.append(ShortOfMemory(rows[0], message, "its decoder step does not fit"))
            return [], None
        self.counts.decoder_splits += 1
        log.info("decoder out of memory with %d requests; splitting: %s", len(rows), message)
        half = len(rows) // 2
        left, left_hidden = self.decode(rows[:half], out)
        right, right_hidden = self.decode(rows[half:], out)
        parts = [t for t in (left_hidden, right_hidden) if t is not None]
        return left + right, (torch.cat(parts) if parts else None)

    def _decode_once(self, rows: list[Request]) -> torch.Tensor:
        """One decoder call (its inputs are this frame's: a split's halves do not hold the whole batch's);
        under a budget (virtual, or CUDA's) its transient counts, with none the tracker is skipped."""
        self.counts.decoder_calls += 1
        canvas, soft, caches = canvases(self.pool, rows), soft_embeds(self.pool, rows), [r.cache for r in rows]
        with nullcontext() if isinstance(self.memory, HostMemory) else self.memory.measure():
            return self.runner.decode(canvas, soft, None, caches, hidden_only=True)

    def sample(self, rows: list[Request], hidden: torch.Tensor, out: ExecuteOutput) -> None:
        """The sampler step for `rows` (all of one RunOptions). When even one request's tile does not
        fit, the tiles that ran have advanced their rows; the first row that did not step is short of
        memory, and the others step next time (fail_on_oom: every row fails with the step's sentence)."""
        sampler, slots = self.pool[rows[0].options], [r.slot for r in rows]
        started, before = self.clock.mark(), [sampler.steps_done(s) for s in slots]
        try:
            plan, failed = sampler.step(None, slots, hidden=hidden).plan, None
        except torch.OutOfMemoryError as err:  # leave the except block: its traceback holds the failed tile
            plan, failed = None, (str(err), getattr(err, "sentence", str(err)), getattr(err, "figures", None))
        if failed and rows[0].options.fail_on_oom:  # the run fails with the step's sentence and its ledger
            oom = {**(failed[2] or {}), "held": dict(self.resident.by_term)}
            out.sampled.append(SamplerOutput(rows, error=failed[1], oom=oom))
            return
        if failed:
            moved = [sampler.steps_done(s) > b for s, b in zip(slots, before)]
            out.short.append(ShortOfMemory(rows[moved.index(False)], failed[0], "its sampler step does not fit"))
            rows, slots = [r for r, m in zip(rows, moved) if m], [s for s, m in zip(slots, moved) if m]
            if not rows:
                return
        elif plan is not None:  # the call's ledger: what the engine held while it ran
            plan = replace(plan, held=dict(self.resident.by_term))
        host = to_host(sampler.outputs(slots, plan))  # waits for the step's end
        self.clock.charge(started, self.clock.mark(), rows, "sampler_seconds")
        self.clock.settle()  # after the host copy: before any row finishes (in update) and reports its shares
        out.sampled.append(SamplerOutput(rows, host, plan, [sampler.steps_done(s) for s in slots],
                                         [sampler.swept(s) for s in slots]))
