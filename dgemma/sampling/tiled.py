"""The tiled sampler: preallocated per-slot state for `max_num_seqs` requests, and one step
over any of them in tiles sized from free memory, split and retried on out-of-memory
(docs/design.md, tiling)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field, fields, replace

import torch

from dgemma.errors import first_line
from dgemma.events import TilePlan, TileSplit
from dgemma.memory import Calibration, HostMemory, plan_tiles, split_tiles
from dgemma.memory.repeats import Repeats
from dgemma.sampling.calibration import calibrate_tile, row_kind
from dgemma.sampling.keyed import INIT, RowKey, keyed_tokens, row_keys
from dgemma.sampling.params import SamplingParams, parse_tiling
from dgemma.sampling.primitives import (
    MAX_STABILITY, Phase, Scores, TileFn, TileInputs, TileResult, group_bytes_for, pad_vocabulary,
)  # fmt: skip
from dgemma.sampling.schedulers import phase, scheduler_for
from dgemma.sampling.start import CanvasStart
from dgemma.sampling.steps import SamplerConfig, step_for

# Slot phases.
FREE, DENOISING, COMMITTING = 0, 1, 2


class TileOutOfMemory(torch.OutOfMemoryError):
    """A tile ran out of memory and was not split: the allocator's line, the one sentence a run that
    fails on it shows, and its numbers."""

    def __init__(self, requests: int, needed_bytes: int, free_bytes: int, detail: str):
        super().__init__(detail)
        self.sentence = f"The sampler step of {requests} requests in one tile raised torch.OutOfMemoryError."
        self.figures = dict(requests=requests, needed_bytes=int(needed_bytes), free_bytes=int(free_bytes), detail=detail)


@dataclass
class StepOutput:
    """What one sampler call produced, as views of the per-slot output buffers (row i = slots[i])."""

    slots: list[int]
    next_canvas: torch.Tensor  # [n, CL] the canvas the decoder reads next step
    draft: torch.Tensor  # [n, CL] argmax canvas (what commits)
    entropy: torch.Tensor  # [n, CL]
    accepted: torch.Tensor  # [n, CL]
    mean_entropy: torch.Tensor  # [n]
    converged: torch.Tensor  # [n]
    finite: torch.Tensor  # [n] False where a request's logits held NaN/inf
    plan: TilePlan | None = None


@dataclass
class _HostSlot:
    """A slot's request on the host: its settings, canvas and step count (the one step count)."""

    params: SamplingParams = field(default_factory=SamplingParams)
    canvas_index: int = 0
    steps: int = 0  # denoising steps done on the current canvas
    pinned: bool = False  # the current canvas holds pinned positions (`TiledSampler.pins`)

    def phase(self) -> Phase:
        """Where this canvas's next forward falls in its scheduler's plan."""
        return phase(self.params, self.steps)

    def row(self) -> RowKey:
        p, scheduler = self.params, scheduler_for(self.params)
        return RowKey(p.seed, self.canvas_index, self.steps, not scheduler.samples(p), p.scheduler.name, self.phase().sweep > 0,
                      scheduler.reads_raw)  # fmt: skip


class TiledSampler:
    """Per-slot state for `config.max_num_seqs` requests and the tiled step over them, built complete from
    its one config: its step `config.impl` (steps.STEPS: "reference", eager, the one that runs out of
    memory, or "chunked", streaming the vocabulary) or its own `config.tile_fn`, compiled or not. A
    `vocab_size` above the LM head's rows pads the logits to it (`pad_vocabulary`). An unsplit tile that
    runs out of memory raises TileOutOfMemory (`SamplerConfig`: tiling and split)."""

    def __init__(self, config: SamplerConfig):
        if config.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {config.max_num_seqs}")
        if config.canvas_length < 1:
            raise ValueError(f"canvas_length must be >= 1, got {config.canvas_length}")
        if config.vocab_size < 2:
            raise ValueError(f"vocab_size must be >= 2, got {config.vocab_size}")
        memory = config.memory if config.memory is not None else HostMemory()
        lm_head, embed_weight = config.lm_head, config.embed_weight
        if lm_head is not None and config.vocab_size > lm_head.weight.shape[0]:
            embed_weight, lm_head = pad_vocabulary(embed_weight, lm_head, config.vocab_size)
        self.config = config = replace(config, memory=memory, embed_weight=embed_weight, lm_head=lm_head)
        self.tiling, self.split = parse_tiling(config.tiling), config.split
        self.max_num_seqs, self.canvas_length, self.vocab_size = config.max_num_seqs, config.canvas_length, config.vocab_size
        self.embed_weight, self.normalizer = config.embed_weight, float(config.normalizer)
        self.device = config.embed_weight.device
        self.memory, self.fraction = memory, config.fraction
        self.tile_fn, self.impl = step_for(config, memory.free_bytes()), config.impl
        # Transient per request by the costliest row a request puts in a tile (calibration.COSTLIEST),
        # each measured on first use; `config.calibration` given: the entropy bound's sampling row's.
        self._calibrations: dict[str, Calibration] = {} if config.calibration is None else {"sample": config.calibration}
        self.lm_head = config.lm_head  # set: step() may take hidden states and project them per tile

        S, CL, H, dev = self.max_num_seqs, self.canvas_length, self.embed_weight.shape[1], self.device
        # State, preallocated per slot (vLLM's indexed-slot pattern); settings stay on the host.
        self.canvas = torch.zeros(S, CL, dtype=torch.long, device=dev)
        self.draft = torch.zeros(S, CL, dtype=torch.long, device=dev)
        self.phase = torch.zeros(S, dtype=torch.int8, device=dev)
        self.history = torch.full((S, MAX_STABILITY, CL), -1, dtype=torch.long, device=dev)
        self.history_valid = torch.zeros(S, MAX_STABILITY, dtype=torch.bool, device=dev)
        self.soft = torch.zeros(S, CL, H, dtype=self.embed_weight.dtype, device=dev)
        self.logprobs = torch.zeros(S, CL, dtype=torch.float32, device=dev)
        self.pins = torch.full((S, CL), -1, dtype=torch.long, device=dev)  # a pinned position's token, else -1
        self.committed = torch.zeros(S, CL, dtype=torch.bool, device=dev)  # block refinement's committed positions
        # Output buffers: cleared once per call, each tile writes only its own slots' rows.
        self.out_entropy = torch.zeros(S, CL, dtype=torch.float32, device=dev)
        self.out_accepted = torch.zeros(S, CL, dtype=torch.bool, device=dev)
        self.out_mean_entropy = torch.zeros(S, dtype=torch.float32, device=dev)
        self.out_converged = torch.zeros(S, dtype=torch.bool, device=dev)
        self._host = [_HostSlot() for _ in range(S)]
        self._repeats = Repeats()  # what a group of positions allocates, counted once (TileInputs.repeats)

    # ---- slots

    def start_canvas(self, slot: int, params: SamplingParams, canvas_index: int, start: CanvasStart | None = None) -> None:
        """Begin denoising a fresh canvas in `slot`: keyed uniform random tokens, empty history; the
        first canvas (canvas_index 0) takes `start`'s tokens from position 0 and holds its pins."""
        host = self._host[slot]
        start = start if start and canvas_index == 0 else None
        host.params, host.canvas_index, host.steps, host.pinned = params, canvas_index, 0, bool(start and start.pins)
        keys = row_keys([host.row()], INIT, self.device)
        self.canvas[slot] = keyed_tokens(keys, self.canvas_length, self.vocab_size)[0]
        self.pins[slot] = -1  # a tile holding a pinned row reads every row's pins
        if start:
            place_start(self.canvas[slot], self.pins[slot], start)
        self.draft[slot] = self.canvas[slot]
        self.committed[slot] = self.pins[slot] >= 0  # a pinned position counts as committed
        self.phase[slot] = DENOISING
        self.history[slot] = -1
        self.history_valid[slot] = False
        self.history_valid[slot, MAX_STABILITY - params.stability_threshold :] = params.stability_threshold > 0
        self.soft[slot] = 0  # no self-conditioning on a canvas's first step (transformers: zeros)

    def free(self, slot: int) -> None:
        self.phase[slot] = FREE
        self._host[slot] = _HostSlot()

    def steps_done(self, slot: int) -> int:
        """Decoder forwards the slot's canvas has taken (a corrector sweep is one)."""
        return self._host[slot].steps

    def swept(self, slot: int) -> bool:
        """Whether the slot's last forward was a corrector sweep (not a predictor step)."""
        host = self._host[slot]
        return host.steps > 0 and phase(host.params, host.steps - 1).sweep > 0

    def soft_embeds(self, slots: Sequence[int]) -> torch.Tensor:
        """[n, CL, hidden] self-conditioning input for the decoder (zeros on a canvas's first step)."""
        return self.soft[self._index(slots)]

    def take_logprobs(self, slot: int) -> torch.Tensor:
        """The committed draft's per-position logprobs, computed when the canvas converged."""
        return self.logprobs[slot].clone()

    def _index(self, slots: Sequence[int]) -> torch.Tensor:
        return torch.as_tensor(list(slots), dtype=torch.long, device=self.device)

    # ---- memory

    def calibration(self, slots: Sequence[int] | None = None) -> Calibration:
        """Transient bytes per request of this sampler's step for the requests in `slots` (None: the
        entropy bound's), measured once per kind of row on meta tensors: the costliest kind among them."""
        kinds = {"sample"} if slots is None else {row_kind(self._host[s].params) for s in slots}
        for kind in kinds - set(self._calibrations):
            self._calibrations[kind] = calibrate_tile(
                self.tile_fn, self.canvas_length, self.vocab_size, self.embed_weight, self.lm_head, kind=kind
            )
        return max((self._calibrations[k] for k in kinds), key=lambda c: (c.bytes_per_request, c.fixed_bytes))

    def _group(self, n: int, free: int, calibration: Calibration) -> int:
        """Requests per tile: all of them (off), the planner's pick (auto) or the fixed size."""
        if self.tiling == "off":
            return n
        if self.tiling == "auto":
            return plan_tiles(n, free, calibration, self.fraction)
        return max(1, min(n, self.tiling))

    # ---- the step

    def _tile_inputs(self, slots: Sequence[int], idx: torch.Tensor) -> TileInputs:
        hosts = [self._host[s] for s in slots]
        # Per-row settings from the host, in float32 as the device would compute them.
        table = torch.tensor(
            [[h.params.t_min, h.params.t_max, h.params.max_denoising_steps, h.steps, h.params.entropy_bound,
              h.params.confidence_threshold] for h in hosts], dtype=torch.float32,
        )  # fmt: skip
        t_min, t_max, max_steps, steps, bound, threshold = table.unbind(1)
        remaining = max_steps - steps
        temperature = t_min + (t_max - t_min) * remaining / max_steps
        dev = self.device
        rows = [h.row() for h in hosts]
        others = [i for i, row in enumerate(rows) if row.raw]
        scheduled = {}
        if others:  # block refinement and DDIM read the raw distribution (temperature 1) and their plan
            phases = [h.phase() for h in hosts]
            temperature[others] = 1.0
            remaining[others] = torch.tensor([float(not phases[i].last) for i in others]) + 1
            scheduled = dict(params=[h.params for h in hosts], phases=phases, canvas=self.canvas[idx],
                             committed=self.committed[idx])
        return TileInputs(
            rows=rows, temperature=temperature.to(dev, non_blocking=True), entropy_bound=bound.to(dev, non_blocking=True),
            confidence_threshold=threshold.to(dev, non_blocking=True), last_step=(remaining <= 1).to(dev, non_blocking=True),
            history=self.history[idx], history_valid=self.history_valid[idx], group_bytes=group_bytes_for(dev),
            # Only a tile holding a pinned row reads pins: the others pay nothing for them.
            pins=self.pins[idx] if any(h.pinned for h in hosts) else None, repeats=self._repeats, **scheduled,
        )  # fmt: skip

    def _run_tile(self, scores: Scores, slots: Sequence[int]) -> None:
        idx = self._index(slots)
        result = run_tile(self.tile_fn, self._repeats, scores, self._tile_inputs(slots, idx), self.embed_weight, self.normalizer)
        # Write state only once the whole tile succeeded (a failed tile leaves no trace). A corrector
        # sweep changes only the canvas: the draft, history and self-conditioning stay its predictor's.
        self.canvas[idx] = result.next_canvas
        if result.committed is not None:
            self.committed[idx] = result.committed
        self.phase[idx] = torch.where(result.converged, COMMITTING, DENOISING).to(torch.int8)
        self.out_accepted[idx] = result.accepted  # a sweep's: the positions it resampled
        self.out_converged[idx] = result.converged
        # A sweep's frame shows its predictor's draft and entropy (it computes neither).
        predicted = [i for i, s in enumerate(slots) if not self._host[s].row().sweep]
        if len(predicted) < len(slots):
            keep = torch.tensor(predicted, dtype=torch.long, device=idx.device)
            idx = idx[keep]
            result = replace(result, draft=result.draft[keep], history=result.history[keep], entropy=result.entropy[keep],
                             mean_entropy=result.mean_entropy[keep], soft_embeds=result.soft_embeds[keep],
                             logprobs=result.logprobs[keep])  # fmt: skip
        self.draft[idx] = result.draft
        self.history[idx] = result.history
        self.soft[idx] = result.soft_embeds.to(self.soft.dtype)
        self.logprobs[idx] = result.logprobs
        self.out_entropy[idx] = result.entropy
        self.out_mean_entropy[idx] = result.mean_entropy
        for s in slots:
            self._host[s].steps += 1

    def _run_tiles(self, scores: Scores, slots: list[int], group: int, free: int) -> tuple[list[int], list[TileSplit]]:
        """Run the tiles of `group` requests; an out-of-memory tile is split in half and retried down to one request."""
        pending = split_tiles(len(slots), group, even=self.tiling == "auto")  # a fixed size is kept as asked
        ran: list[int] = []
        splits: list[TileSplit] = []
        while pending:
            start, end = pending.pop(0)
            try:
                self._run_tile(scores.select(slice(start, end)), slots[start:end])
                ran.append(end - start)
            except torch.OutOfMemoryError as err:
                if self.tiling == "off" or not self.split or end - start == 1:
                    raise TileOutOfMemory(end - start, self.calibration(slots).tile_bytes(end - start), free,
                                          first_line(err, 300)) from None
                splits.append(TileSplit(start, end - start, first_line(err, 300)))
                mid = start + (end - start) // 2
                pending[:0] = [(start, mid), (mid, end)]
        return ran, splits

    def step(self, logits: torch.Tensor | None, slots: Sequence[int], hidden: torch.Tensor | None = None) -> StepOutput:
        """One denoising step for the requests in `slots`, given their logits [n, CL, vocab] or,
        with an `lm_head`, their decoder hidden states [n, CL, hidden] (projected per tile)."""
        slots = [int(s) for s in slots]
        scores = Scores.checked(logits, hidden, len(slots), self.canvas_length, self.vocab_size, self.lm_head)
        started = time.time()
        free = self.memory.free_bytes()
        calibration = self.calibration(slots)
        group = self._group(len(slots), free, calibration)

        # Clear this call's output rows once: each tile writes only its own rows. Other slots
        # keep theirs (a caller retrying after an out-of-memory still reads the tiles that ran); a
        # corrector sweep's row keeps its predictor's entropy.
        idx = self._index(slots)
        predicting = self._index([s for s in slots if not self._host[s].row().sweep])
        for out in (self.out_entropy, self.out_accepted, self.out_mean_entropy, self.out_converged):
            out[idx if out.dtype == torch.bool else predicting] = 0  # (False, for the boolean ones)
        with self.memory.measure() as measured:
            ran, splits = self._run_tiles(scores, slots, group, free)

        plan = TilePlan(
            time=started, impl=self.impl, num_decode=len(slots), canvas_length=self.canvas_length,
            vocab_size=self.vocab_size, free_bytes=int(free), budget_bytes=self.memory.capacity_bytes(),
            bytes_per_request=calibration.bytes_per_request, group=group, tiles=tuple(ran),
            # Unmeasured (a CPU with no budget skips the tracker's cost): the calibrated estimate.
            peak_transient_bytes=int(calibration.tile_bytes(max(ran, default=0)) if measured.peak_bytes is None else measured.peak_bytes),
            peak_measured=measured.peak_bytes is not None, splits=tuple(splits), seconds=time.time() - started,
        )  # fmt: skip
        return self.outputs(slots, plan)

    def outputs(self, slots: Sequence[int], plan: TilePlan | None = None) -> StepOutput:
        """Views of the last step's per-slot outputs for `slots` (row i = slots[i])."""
        slots = [int(s) for s in slots]
        idx = self._index(slots)
        mean = self.out_mean_entropy[idx]
        return StepOutput(slots=slots, next_canvas=self.canvas[idx], draft=self.draft[idx], entropy=self.out_entropy[idx],
                          accepted=self.out_accepted[idx], mean_entropy=mean, converged=self.out_converged[idx],
                          finite=torch.isfinite(mean), plan=plan)


def run_tile(tile_fn: TileFn, repeats: Repeats, scores: Scores, inputs: TileInputs, embed_weight: torch.Tensor,
             normalizer: float) -> TileResult:
    """`tile_fn` over one tile, counted once per shape: a tile allocates what its size, its rows'
    kinds (scheduler, greedy or sampling, corrector sweep), its pins and its input's kind say, so under the tracker (the
    budgeted virtual device) the first tile of each shape is counted op by op and the rest are
    charged its peak (memory/repeats.py), since counting a tile's few hundred small ops (keyed
    noise, phases 4-6) one by one in every tile is a measurable share of a step."""
    shape = (len(inputs.rows), tuple(row.kind for row in inputs.rows), inputs.pins is None, scores.logits is None)
    with repeats.body(("tile", shape), f"a tile of {len(inputs.rows)} requests") as keep:
        result = tile_fn(scores, inputs, embed_weight, normalizer)
        keep(*(getattr(result, f.name) for f in fields(result) if getattr(result, f.name) is not None))  # what the tile hands on: fresh tensors all
    return result


def place_start(canvas: torch.Tensor, pins: torch.Tensor, start: CanvasStart) -> None:
    """`start`'s tokens over the head of a slot's `canvas` [CL], its pins in `pins` [CL] (held there
    by the step) and on the canvas, in place."""
    if start.tokens:
        canvas[: len(start.tokens)] = torch.tensor(start.tokens, dtype=torch.long)
    if start.pins:
        positions, tokens = (torch.tensor(part, dtype=torch.long) for part in zip(*start.pins))
        pins[positions.to(pins.device)] = tokens.to(pins.device)
        canvas.copy_(torch.where(pins >= 0, pins, canvas))
