"""The request-tiled Diffusion-Gemma sampler: per-slot state, one denoising step, the tiling loop.

One step, per request, over its [CL, vocab] logits (design.md, phases 1-7):

    1. temperature    t = t_min + (t_max - t_min) * remaining / max_steps
    2. sample         Gumbel-max on logits / t; the plain argmax is the draft canvas
    3. confidence     log_softmax -> probs -> per-token entropy; mean < threshold = confident
    4. acceptance     sort entropies, accept the longest prefix with cumsum - cummax <= bound;
                      the rest are re-noised with uniform random tokens
    5. stability      the draft unchanged for `stability_threshold` steps
    6. convergence    stable and confident, or the last step: the canvas commits next
    7. carry-over     the self-conditioning soft embedding probs @ embed * normalizer ([CL, hidden],
                      never [CL, vocab]) and the draft's logprobs, held until the commit

`reference_tile` is that step in plain eager PyTorch, in the order the source runs it, so its
peak holds the source's ~7 fp32 copies of [n, CL, vocab]: it is the sampler that runs out of
memory, the subject of the lesson. `TiledSampler.step` runs it over tiles sized by the planner.

Randomness is keyed by (seed, canvas, step, purpose) per request, never drawn from a global
stream, so any tile split and any batch composition give the same tokens.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from dgemma.events import TilePlan, TileSplit
from dgemma.sampling.params import MAX_STABILITY, SamplingParams, parse_tiling
from dgemma.memory import Calibration, HostMemory, MemoryDevice, calibrate, plan_tiles, split_tiles

# Slot phases.
FREE, DENOISING, COMMITTING = 0, 1, 2

# Purposes of keyed random numbers: a request draws each of these once per (canvas, step).
INIT, GUMBEL, RENOISE = 1, 2, 3


# --------------------------------------------------------------------------- keyed randomness
#
# Every random number a request uses is a pure function of (its seed, canvas, step, purpose,
# position, token): a counter-based hash rather than a stream, so any tile split, any batch
# composition and any vocab chunk (the chunked sampler draws one slice of the vocabulary at a
# time) sees exactly the same numbers.

_U64 = 1 << 64


def _signed(x: int) -> int:
    """A 64-bit pattern as torch's int64 (whose multiply wraps like uint64)."""
    x &= _U64 - 1
    return x - _U64 if x >= 1 << 63 else x


_GOLDEN = _signed(0x9E3779B97F4A7C15)
_FMIX1 = _signed(0xFF51AFD7ED558CCD)
_FMIX2 = _signed(0xC4CEB9FE1A85EC53)


def _mix64(x: int) -> int:
    """splitmix64 finaliser on Python ints: spreads nearby keys over the 64-bit space."""
    x = (x + 0x9E3779B97F4A7C15) & (_U64 - 1)
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & (_U64 - 1)
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & (_U64 - 1)
    return x ^ (x >> 31)


def stream_key(seed: int, canvas_index: int, step: int, purpose: int) -> int:
    """The key of one request's random numbers for one (canvas, step, purpose), as int64."""
    key = _mix64(seed)
    for part in (canvas_index, step, purpose):
        key = _mix64(key ^ part)
    return _signed(key)


@dataclass(frozen=True)
class RowKey:
    """Who a tile row is, for its random numbers: the request's seed, canvas and step."""

    seed: int
    canvas_index: int
    step: int


def row_keys(rows: Sequence[RowKey], purpose: int, device: torch.device) -> torch.Tensor:
    """[n] int64 keys, one per row (built on the host: no device reads)."""
    keys = [stream_key(r.seed, r.canvas_index, r.step, purpose) for r in rows]
    return torch.tensor(keys, dtype=torch.long).to(device, non_blocking=True)


def _shift_right(z: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical right shift of int64 (torch's >> is arithmetic)."""
    return (z >> bits) & ((1 << (64 - bits)) - 1)


def _fmix64(z: torch.Tensor) -> torch.Tensor:
    """murmur3's 64-bit finaliser, in place."""
    z ^= _shift_right(z, 33)
    z *= _FMIX1
    z ^= _shift_right(z, 33)
    z *= _FMIX2
    z ^= _shift_right(z, 33)
    return z


def keyed_uniform(keys: torch.Tensor, canvas_length: int, vocab_size: int, start: int = 0, stop: int | None = None) -> torch.Tensor:
    """Uniforms in (0, 1), [n, CL, stop - start] float32: entry (i, p, v) is a hash of
    (keys[i], p * vocab + v), so a vocab slice equals the same slice of the whole draw."""
    stop = vocab_size if stop is None else stop
    device = keys.device
    # counter * golden, split so no [CL, vocab] counter tensor is ever built (int64 wraps):
    # (p * V + v + 1) * G = p * V * G + v * G + G
    along_vocab = torch.arange(start, stop, device=device) * _GOLDEN
    along_canvas = torch.arange(canvas_length, device=device) * _signed(vocab_size * (_GOLDEN % _U64))
    z = (keys + _GOLDEN).view(-1, 1, 1) + along_canvas.view(1, -1, 1)
    z = z + along_vocab.view(1, 1, -1)
    bits = _shift_right(_fmix64(z), 40)  # top 24 bits: exact in float32
    return (bits.to(torch.float32) + 0.5) * (2.0**-24)


def keyed_tokens(keys: torch.Tensor, canvas_length: int, vocab_size: int) -> torch.Tensor:
    """Uniform random token ids [n, CL] (uniform up to a bias of vocab / 2^63)."""
    positions = torch.arange(canvas_length, device=keys.device) * _GOLDEN
    z = (keys + _GOLDEN).view(-1, 1) + positions.view(1, -1)
    return _shift_right(_fmix64(z), 1) % vocab_size


# --------------------------------------------------------------------------- the step


@dataclass(frozen=True)
class LMHead:
    """The model's output projection: logits = softcap(hidden @ weight.T) in fp32 (as transformers)."""

    weight: torch.Tensor  # [vocab, hidden]
    softcap: float | None = None

    def project(self, hidden: torch.Tensor, start: int = 0, stop: int | None = None) -> torch.Tensor:
        """fp32 logits of vocab entries [start, stop) for hidden states [..., hidden]."""
        weight = self.weight if start == 0 and stop in (None, self.weight.shape[0]) else self.weight[start:stop]
        logits = torch.nn.functional.linear(hidden, weight).float()
        if self.softcap is not None:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits


@dataclass(frozen=True)
class Scores:
    """What a tile samples from: logits [n, CL, vocab], or hidden states [n, CL, hidden] and the
    LM head that projects them (then no [n, CL, vocab] tensor need exist outside a tile)."""

    logits: torch.Tensor | None = None
    hidden: torch.Tensor | None = None
    head: LMHead | None = None

    @property
    def rows(self) -> int:
        return (self.logits if self.logits is not None else self.hidden).shape[0]

    @property
    def vocab_size(self) -> int:
        return self.logits.shape[-1] if self.logits is not None else self.head.weight.shape[0]

    def tile(self, start: int, stop: int) -> Scores:
        if self.logits is not None:
            return Scores(logits=self.logits[start:stop])
        return Scores(hidden=self.hidden[start:stop], head=self.head)

    def full(self) -> torch.Tensor:
        """The tile's fp32 logits over the whole vocabulary (the projection's output, if any)."""
        return self.logits.float() if self.logits is not None else self.head.project(self.hidden)

    def chunk(self, start: int, stop: int) -> torch.Tensor:
        """fp32 logits of vocab entries [start, stop) only."""
        if self.logits is not None:
            return self.logits[..., start:stop].float()
        return self.head.project(self.hidden, start, stop)


@dataclass
class TileInputs:
    """The per-row settings and state one tile reads (rows = requests in the tile)."""

    rows: list[RowKey]
    temperature: torch.Tensor  # [n] float32
    sample: torch.Tensor  # [n] float32: 1 = stochastic (Gumbel noise), 0 = greedy
    entropy_bound: torch.Tensor  # [n] float32
    confidence_threshold: torch.Tensor  # [n] float32
    last_step: torch.Tensor  # [n] bool: this step is the canvas's last allowed one
    history: torch.Tensor  # [n, MAX_STABILITY, CL] long: previous drafts, -1 where none
    history_valid: torch.Tensor  # [n, MAX_STABILITY] bool: which history entries count


@dataclass
class TileResult:
    next_canvas: torch.Tensor  # [n, CL] long: accepted samples, the rest re-noised
    draft: torch.Tensor  # [n, CL] long: argmax canvas
    entropy: torch.Tensor  # [n, CL] float32
    accepted: torch.Tensor  # [n, CL] bool
    mean_entropy: torch.Tensor  # [n] float32
    confident: torch.Tensor  # [n] bool: mean entropy below the threshold
    converged: torch.Tensor  # [n] bool
    history: torch.Tensor  # [n, MAX_STABILITY, CL] long
    soft_embeds: torch.Tensor  # [n, CL, hidden]
    logprobs: torch.Tensor  # [n, CL] float32: log p(draft token)


def reference_tile(
    scores: Scores,
    inputs: TileInputs,
    embed_weight: torch.Tensor,
    normalizer: float,
) -> TileResult:
    """One denoising step over a tile's logits [n, CL, vocab], eager, in the source's order.

    Pure: reads `inputs`, returns new tensors, writes no state, so a tile that runs out of
    memory can be split and retried with no trace of the failed attempt.
    """
    logits = scores.full()
    n, canvas_length, vocab_size = logits.shape
    device = logits.device

    # ---- Phase 1: temperature schedule (per row: requests carry their own settings)
    temp = inputs.temperature

    # ---- Phase 2: temperature scaling + Gumbel-max sampling
    scaled = logits.float() / temp[:, None, None]
    u = keyed_uniform(row_keys(inputs.rows, GUMBEL, device), canvas_length, vocab_size)
    gumbel = -torch.log(-torch.log(u))
    noisy = scaled + gumbel * inputs.sample[:, None, None]  # greedy rows: no noise
    sampled = noisy.argmax(dim=-1)
    draft = scaled.argmax(dim=-1)

    # ---- Phase 3: probabilities and confidence
    log_probs = scaled.log_softmax(dim=-1)
    probs = log_probs.exp()
    entropy = -(probs * log_probs).sum(dim=-1)  # [n, CL]
    mean_entropy = entropy.mean(dim=-1)
    confident = mean_entropy < inputs.confidence_threshold

    # ---- Phases 4-6: acceptance, re-noising, stability, convergence
    next_canvas, accepted, history, converged = settle(sampled, draft, entropy, confident, inputs, vocab_size)

    # ---- Phase 7: carry-over: self-conditioning soft embedding and the draft's logprobs
    soft_embeds = torch.matmul(probs.to(embed_weight.dtype), embed_weight) * normalizer
    logprobs = log_probs.gather(-1, draft[..., None]).squeeze(-1)

    return TileResult(next_canvas, draft, entropy, accepted, mean_entropy, confident, converged, history, soft_embeds, logprobs)


def settle(
    sampled: torch.Tensor,
    draft: torch.Tensor,
    entropy: torch.Tensor,
    confident: torch.Tensor,
    inputs: TileInputs,
    vocab_size: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Phases 4-6 on [n, CL] tensors, shared by every step implementation:
    returns (next canvas, accepted mask, new history, converged)."""
    canvas_length = draft.shape[1]

    # ---- Phase 4: entropy-bound acceptance; re-noise the rest
    sorted_ent, sorted_idx = torch.sort(entropy, dim=-1, stable=True)
    cumsum_ent = torch.cumsum(sorted_ent, dim=-1)
    cummax_ent = torch.cummax(sorted_ent, dim=-1).values
    sorted_mask = (cumsum_ent - cummax_ent) <= inputs.entropy_bound[:, None]
    accepted = torch.zeros_like(sorted_mask).scatter_(1, sorted_idx, sorted_mask)
    renoise = keyed_tokens(row_keys(inputs.rows, RENOISE, draft.device), canvas_length, vocab_size)
    next_canvas = torch.where(accepted, sampled, renoise)

    # ---- Phase 5: stability: the draft equals each of the last `stability_threshold` drafts
    same = (inputs.history == draft[:, None, :]).all(dim=-1) | ~inputs.history_valid
    stable = same.all(dim=-1)
    history = torch.cat([inputs.history[:, 1:], draft[:, None, :]], dim=1)

    # ---- Phase 6: convergence
    converged = (stable & confident) | inputs.last_step
    return next_canvas, accepted, history, converged


# --------------------------------------------------------------------------- per-slot state


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
    """Host-side mirror of what the keyed random streams need (no device reads in the hot path)."""

    params: SamplingParams = field(default_factory=SamplingParams)
    canvas_index: int = 0
    steps: int = 0  # denoising steps done on the current canvas


class TiledSampler:
    """Per-slot state for `max_num_seqs` requests and the tiled step over them.

    tiling: "auto" (plan tiles from free memory; split a tile that still runs out of memory),
    "off" (one tile, no retry: the untiled run of the lesson), or an int (fixed tile size).
    """

    def __init__(
        self,
        max_num_seqs: int,
        canvas_length: int,
        vocab_size: int,
        embed_weight: torch.Tensor,
        normalizer: float,
        memory: MemoryDevice | None = None,
        tiling: str | int = "auto",
        fraction: float = 0.5,
        tile_fn=reference_tile,
        impl: str = "reference",
        calibration: Calibration | None = None,
        lm_head: LMHead | None = None,
    ):
        if max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {max_num_seqs}")
        if canvas_length < 1:
            raise ValueError(f"canvas_length must be >= 1, got {canvas_length}")
        if vocab_size < 2:
            raise ValueError(f"vocab_size must be >= 2, got {vocab_size}")
        self.tiling = parse_tiling(tiling)
        self.max_num_seqs = max_num_seqs
        self.canvas_length = canvas_length
        self.vocab_size = vocab_size
        self.embed_weight = embed_weight
        self.normalizer = float(normalizer)
        self.device = embed_weight.device
        self.memory = memory if memory is not None else HostMemory()
        self.fraction = fraction
        self.tile_fn = tile_fn
        self.impl = impl
        self._calibration = calibration  # None: measured on first use
        self.lm_head = lm_head  # set: step() may take hidden states and project them per tile

        S, CL, H, dev = max_num_seqs, canvas_length, embed_weight.shape[1], self.device
        # State, preallocated per slot (vLLM's indexed-slot pattern).
        self.canvas = torch.zeros(S, CL, dtype=torch.long, device=dev)
        self.draft = torch.zeros(S, CL, dtype=torch.long, device=dev)
        self.phase = torch.zeros(S, dtype=torch.int8, device=dev)
        self.step_count = torch.zeros(S, dtype=torch.int32, device=dev)
        self.history = torch.full((S, MAX_STABILITY, CL), -1, dtype=torch.long, device=dev)
        self.history_valid = torch.zeros(S, MAX_STABILITY, dtype=torch.bool, device=dev)
        self.confident = torch.zeros(S, dtype=torch.bool, device=dev)
        self.soft = torch.zeros(S, CL, H, dtype=embed_weight.dtype, device=dev)
        self.logprobs = torch.zeros(S, CL, dtype=torch.float32, device=dev)
        # Per-slot settings as tensors, so a tile of mixed requests runs as one batch.
        self.t_min = torch.zeros(S, dtype=torch.float32, device=dev)
        self.t_max = torch.zeros(S, dtype=torch.float32, device=dev)
        self.max_steps = torch.ones(S, dtype=torch.float32, device=dev)
        self.sample = torch.zeros(S, dtype=torch.float32, device=dev)
        self.entropy_bound = torch.zeros(S, dtype=torch.float32, device=dev)
        self.confidence_threshold = torch.zeros(S, dtype=torch.float32, device=dev)
        # Output buffers: cleared once per call, each tile writes only its own slots' rows.
        self.out_entropy = torch.zeros(S, CL, dtype=torch.float32, device=dev)
        self.out_accepted = torch.zeros(S, CL, dtype=torch.bool, device=dev)
        self.out_mean_entropy = torch.zeros(S, dtype=torch.float32, device=dev)
        self.out_converged = torch.zeros(S, dtype=torch.bool, device=dev)
        self._host = [_HostSlot() for _ in range(S)]

    # ---- slots

    def start_canvas(self, slot: int, params: SamplingParams, canvas_index: int) -> None:
        """Begin denoising a fresh canvas in `slot`: keyed uniform random tokens, empty history."""
        host = self._host[slot]
        host.params, host.canvas_index, host.steps = params, canvas_index, 0
        keys = row_keys([RowKey(params.seed, canvas_index, 0)], INIT, self.device)
        self.canvas[slot] = keyed_tokens(keys, self.canvas_length, self.vocab_size)[0]
        self.draft[slot] = self.canvas[slot]
        self.phase[slot] = DENOISING
        self.step_count[slot] = 0
        self.history[slot] = -1
        self.history_valid[slot] = False
        self.history_valid[slot, MAX_STABILITY - params.stability_threshold :] = params.stability_threshold > 0
        self.confident[slot] = False
        self.soft[slot] = 0  # no self-conditioning on a canvas's first step (transformers: zeros)
        self.t_min[slot] = params.t_min
        self.t_max[slot] = params.t_max
        self.max_steps[slot] = params.max_denoising_steps
        self.sample[slot] = 0.0 if params.greedy else 1.0
        self.entropy_bound[slot] = params.entropy_bound
        self.confidence_threshold[slot] = params.confidence_threshold

    def free(self, slot: int) -> None:
        self.phase[slot] = FREE
        self._host[slot] = _HostSlot()

    def steps_done(self, slot: int) -> int:
        return self._host[slot].steps

    def soft_embeds(self, slots: Sequence[int]) -> torch.Tensor:
        """[n, CL, hidden] self-conditioning input for the decoder (zeros on a canvas's first step)."""
        return self.soft[self._index(slots)]

    def take_logprobs(self, slot: int) -> torch.Tensor:
        """The committed draft's per-position logprobs, computed when the canvas converged."""
        return self.logprobs[slot].clone()

    def _index(self, slots: Sequence[int]) -> torch.Tensor:
        return torch.as_tensor(list(slots), dtype=torch.long, device=self.device)

    # ---- memory

    def calibration(self) -> Calibration:
        """Transient bytes per request of this sampler's step, measured once on meta tensors."""
        if self._calibration is None:
            self._calibration = calibrate_tile(
                self.tile_fn, self.canvas_length, self.vocab_size, self.embed_weight, self.lm_head
            )
        return self._calibration

    # ---- the step

    def _tile_inputs(self, slots: Sequence[int], idx: torch.Tensor) -> TileInputs:
        hosts = [self._host[s] for s in slots]
        steps = torch.tensor([h.steps for h in hosts], dtype=torch.float32, device=self.device)
        max_steps = self.max_steps[idx]
        remaining = max_steps - steps
        t_min, t_max = self.t_min[idx], self.t_max[idx]
        return TileInputs(
            rows=[RowKey(h.params.seed, h.canvas_index, h.steps) for h in hosts],
            temperature=t_min + (t_max - t_min) * remaining / max_steps,
            sample=self.sample[idx],
            entropy_bound=self.entropy_bound[idx],
            confidence_threshold=self.confidence_threshold[idx],
            last_step=remaining <= 1,
            history=self.history[idx],
            history_valid=self.history_valid[idx],
        )

    def _run_tile(self, scores: Scores, slots: Sequence[int]) -> None:
        idx = self._index(slots)
        result = self.tile_fn(scores, self._tile_inputs(slots, idx), self.embed_weight, self.normalizer)
        # Write state only once the whole tile succeeded (a failed tile leaves no trace).
        self.canvas[idx] = result.next_canvas
        self.draft[idx] = result.draft
        self.history[idx] = result.history
        self.soft[idx] = result.soft_embeds.to(self.soft.dtype)
        self.logprobs[idx] = result.logprobs
        self.confident[idx] = result.confident
        self.phase[idx] = torch.where(result.converged, COMMITTING, DENOISING).to(torch.int8)
        self.step_count[idx] += 1
        self.out_entropy[idx] = result.entropy
        self.out_accepted[idx] = result.accepted
        self.out_mean_entropy[idx] = result.mean_entropy
        self.out_converged[idx] = result.converged
        for s in slots:
            self._host[s].steps += 1

    def step(self, logits: torch.Tensor | None, slots: Sequence[int], hidden: torch.Tensor | None = None) -> StepOutput:
        """One denoising step for the requests in `slots`, given their logits [n, CL, vocab] or,
        with an `lm_head`, their decoder hidden states [n, CL, hidden] (projected per tile)."""
        slots = [int(s) for s in slots]
        n = len(slots)
        if (logits is None) == (hidden is None):
            raise ValueError("pass exactly one of logits or hidden")
        if hidden is not None:
            if self.lm_head is None:
                raise ValueError("hidden states need a sampler built with an lm_head")
            if tuple(hidden.shape[:2]) != (n, self.canvas_length):
                raise ValueError(f"hidden of shape {tuple(hidden.shape)} do not match {n} slots x CL {self.canvas_length}")
            scores = Scores(hidden=hidden, head=self.lm_head)
        else:
            if logits.dim() == 2:
                logits = logits.view(n, self.canvas_length, -1)
            if logits.shape[0] != n or logits.shape[1] != self.canvas_length:
                raise ValueError(f"logits of shape {tuple(logits.shape)} do not match {n} slots x CL {self.canvas_length}")
            if logits.shape[2] != self.vocab_size:
                raise ValueError(f"logits vocab {logits.shape[2]} != sampler vocab {self.vocab_size}")
            scores = Scores(logits=logits)
        started = time.time()

        # Plan: how many requests fit in one tile of the step's transient.
        free = self.memory.free_bytes()
        calibration = self.calibration()
        if self.tiling == "off":
            group = n
        elif self.tiling == "auto":
            group = plan_tiles(n, free, calibration, self.fraction)
        else:
            group = max(1, min(n, self.tiling))

        # Clear this call's output rows once: each tile below writes only its own rows. Other
        # slots keep theirs (a caller retrying after an out-of-memory still reads the tiles that ran).
        idx = self._index(slots)
        self.out_entropy[idx] = 0
        self.out_accepted[idx] = False
        self.out_mean_entropy[idx] = 0
        self.out_converged[idx] = False

        pending = split_tiles(n, group)
        ran: list[int] = []
        splits: list[TileSplit] = []
        with self.memory.measure() as measured:
            while pending:
                start, end = pending.pop(0)
                try:
                    self._run_tile(scores.tile(start, end), slots[start:end])
                    ran.append(end - start)
                except torch.OutOfMemoryError as err:
                    # Out of memory is expected: split the tile in half and retry, down to one request.
                    if self.tiling == "off" or end - start == 1:
                        raise
                    splits.append(TileSplit(start, end - start, str(err).splitlines()[0][:300]))
                    mid = start + (end - start) // 2
                    pending[:0] = [(start, mid), (mid, end)]

        plan = TilePlan(
            time=started,
            impl=self.impl,
            num_decode=n,
            canvas_length=self.canvas_length,
            vocab_size=self.vocab_size,
            free_bytes=int(free),
            budget_bytes=self.memory.capacity_bytes(),
            bytes_per_request=calibration.bytes_per_request,
            group=group,
            tiles=tuple(ran),
            # Unmeasured (a CPU with no budget skips the tracker's cost): the calibrated estimate.
            peak_transient_bytes=int(calibration.tile_bytes(max(ran, default=0)) if measured.peak_bytes is None else measured.peak_bytes),
            peak_measured=measured.peak_bytes is not None,
            splits=tuple(splits),
            seconds=time.time() - started,
        )
        return self.outputs(slots, plan)

    def outputs(self, slots: Sequence[int], plan: TilePlan | None = None) -> StepOutput:
        """Views of the last step's per-slot outputs for `slots` (row i = slots[i])."""
        slots = [int(s) for s in slots]
        idx = self._index(slots)
        mean = self.out_mean_entropy[idx]
        return StepOutput(
            slots=slots,
            next_canvas=self.canvas[idx],
            draft=self.draft[idx],
            entropy=self.out_entropy[idx],
            accepted=self.out_accepted[idx],
            mean_entropy=mean,
            converged=self.out_converged[idx],
            finite=torch.isfinite(mean),
            plan=plan,
        )


def meta_tile_inputs(n: int, canvas_length: int) -> TileInputs:
    """Tile inputs on the meta device: shapes without values, for measuring memory at any scale."""
    meta = torch.device("meta")
    return TileInputs(
        rows=[RowKey(0, 0, 0)] * n,
        temperature=torch.empty(n, device=meta),
        sample=torch.empty(n, device=meta),
        entropy_bound=torch.empty(n, device=meta),
        confidence_threshold=torch.empty(n, device=meta),
        last_step=torch.empty(n, dtype=torch.bool, device=meta),
        history=torch.empty(n, MAX_STABILITY, canvas_length, dtype=torch.long, device=meta),
        history_valid=torch.empty(n, MAX_STABILITY, dtype=torch.bool, device=meta),
    )


def calibrate_tile(
    tile_fn, canvas_length: int, vocab_size: int, embed_weight: torch.Tensor, lm_head: LMHead | None = None
) -> Calibration:
    """Measure `tile_fn`'s transient on meta tensors at the real shapes (no RAM, milliseconds).

    With an `lm_head` the tile takes hidden states and its projection's output counts as
    transient; without, the logits are the caller's input and do not.
    """
    meta = torch.device("meta")
    embed = torch.empty(embed_weight.shape, dtype=embed_weight.dtype, device=meta)
    head = None if lm_head is None else LMHead(torch.empty(lm_head.weight.shape, dtype=lm_head.weight.dtype, device=meta), lm_head.softcap)

    def prepare(n: int):
        if head is None:
            scores = Scores(logits=torch.empty(n, canvas_length, vocab_size, dtype=torch.float32, device=meta))
        else:
            scores = Scores(hidden=torch.empty(n, canvas_length, head.weight.shape[1], dtype=head.weight.dtype, device=meta), head=head)
        inputs = meta_tile_inputs(n, canvas_length)
        return lambda: tile_fn(scores, inputs, embed, 1.0)

    return calibrate(prepare, canvas_length, vocab_size)


SAMPLER_IMPLS = ("reference", "chunked")


def build_sampler(
    impl: str,
    max_num_seqs: int,
    canvas_length: int,
    vocab_size: int,
    embed_weight: torch.Tensor,
    normalizer: float,
    memory: MemoryDevice | None = None,
    tiling: str | int = "auto",
    lm_head: LMHead | None = None,
    chunk_size: int | None = None,
    fraction: float = 0.5,
) -> TiledSampler:
    """A tiled sampler running the `impl` step: "reference" (eager, the one that runs out of
    memory) or "chunked" (streams the vocabulary; chunk size from free memory unless given)."""
    memory = memory if memory is not None else HostMemory()
    if impl == "reference":
        tile_fn = reference_tile
    elif impl == "chunked":
        from dgemma.sampling.chunked import choose_chunk_size, chunked_tile

        if chunk_size is None:
            chunk_size = choose_chunk_size(
                vocab_size, canvas_length, max_num_seqs, memory.free_bytes(), embed_weight, lm_head, fraction
            )
        elif chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
        tile_fn = functools.partial(chunked_tile, chunk_size=chunk_size)
    else:
        raise ValueError(f"unknown sampler {impl!r}: choose from {', '.join(SAMPLER_IMPLS)}")
    return TiledSampler(
        max_num_seqs, canvas_length, vocab_size, embed_weight, normalizer,
        memory=memory, tiling=tiling, tile_fn=tile_fn, impl=impl, lm_head=lm_head, fraction=fraction,
    )  # fmt: skip
