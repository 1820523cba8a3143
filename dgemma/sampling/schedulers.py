"""The schedulers, diffusers' way: one class each, behind `DenoisingScheduler`, picked by name from
`SCHEDULER_TABLE`; what a step keeps, commits and re-noises (phases 4-6, docs/design.md, the
schedulers) on a tile's [n, CL] figures. Adding a scheduler is a class here, a row in the table and
its name in `params.SCHEDULERS` (the settings' torch-free list; a test holds the two equal).

- entropy bound: accepts the lowest-entropy positions while their summed entropy (less the
  largest) stays under the bound; the rest is re-noised with keyed tokens.

Block refinement and discrete DDIM read the RAW distribution (temperature 1, `reads_raw`): its
argmax (the draft), its entropy (the stopping rule), its self-conditioning embedding and, for block
refinement, the confidence p(token). With `temperature` > 0 the token each position proposes is
drawn from softmax(logits / T) instead (the block race, keyed), its confidence the tempered
probability, as diffusers 0.42.1's schedulers do.

- block refinement: the canvas holds committed positions (`committed`, per slot, reset at a
  canvas's start; a pinned position counts as committed and holds its token). A step commits what
  the cumulative quota still owes (ceil((step + 1) CL / N) in all), the most confident first, plus
  every position above `commit_threshold`; with `editing_threshold` a committed token the model
  now replaces with confidence above it is edited; the rest is re-noised with keyed tokens.
- discrete DDIM (its arithmetic in sampling/ddim.py): every position takes one of three routes of
  the uniform corruption's posterior q(x_s | x_t, x0) (clean: the proposed token; stay: its
  current token; noise: a keyed token), drawn from a keyed uniform. Its corrector sweeps
  (`corrector_steps`) are decoder forwards of their own, folded into the denoising budget as
  diffusers does (`phase`): a sweep picks `corrector_k` positions by Gumbel-top-k over the
  leave-one-out conditional's confidence and resamples them from it (keyed), in float64.

The stopping rule is every scheduler's (`primitives.stop_test`), once per predictor step; a row of
block refinement or DDIM that stops commits the argmax of that step's raw logits, one that reaches
its last predictor step commits its canvas (block refinement: all committed; DDIM: the clean route
everywhere).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass, fields

import torch

from dgemma.sampling.ddim import discrete_ddim
from dgemma.sampling.params import SamplingParams
from dgemma.sampling.primitives import Phase, Scores, TileInputs, stop_test


@dataclass
class Offered:
    """What phases 1-3 offer a tile's rows [n, CL]: `draft`, the argmax of each row's distribution
    (the entropy bound's tempered one, the others' raw one); `proposed`, the token each position
    offers (the sample); `confidence`, its probability (block refinement's ranking; None where no
    row ranks by it); `entropy`; `renoise`, the keyed tokens of the positions not kept, drawn from
    `vocab_size` entries."""

    draft: torch.Tensor
    proposed: torch.Tensor
    confidence: torch.Tensor | None
    entropy: torch.Tensor
    renoise: torch.Tensor
    vocab_size: int

    def select(self, index: torch.Tensor) -> Offered:
        confidence = None if self.confidence is None else self.confidence[index]
        return Offered(self.draft[index], self.proposed[index], confidence, self.entropy[index], self.renoise[index],
                       self.vocab_size)


@dataclass
class Settled:
    """What phases 4-6 make of a tile's rows: the draft that commits, the next canvas, the accepted
    positions [n, CL], the new history [n, MAX_STABILITY, CL], the mean entropy and whether each
    row converged [n]; `committed`: block refinement's committed positions after the step (the
    input's, unchanged, for other rows; None in a tile that has none)."""

    draft: torch.Tensor
    next_canvas: torch.Tensor
    accepted: torch.Tensor
    history: torch.Tensor
    mean_entropy: torch.Tensor
    converged: torch.Tensor
    committed: torch.Tensor | None = None


class DenoisingScheduler(ABC):
    """One scheduler: which rows sample, how it reads the distribution, how many corrector sweeps
    follow a predictor step, and its phases 4-6 (`settle`) on its own rows of a tile."""

    # Reads the raw distribution (temperature 1) and its place in a plan (`TileInputs.params`,
    # `phases`, `canvas`, `committed`); the entropy bound reads the tempered one and needs neither.
    reads_raw = True

    def samples(self, params: SamplingParams) -> bool:
        """Whether a request with `params` draws its proposals (else they are the argmax)."""
        return params.temperature > 0

    def sweeps(self, params: SamplingParams) -> int:
        """Corrector sweeps after each corrected predictor step (only discrete DDIM has them)."""
        return 0

    @abstractmethod
    def settle(self, inputs: TileInputs, offered: Offered) -> Settled:
        """Phases 4-6 on rows that are all this scheduler's predictor rows."""


class EntropyBound(DenoisingScheduler):
    reads_raw = False

    def samples(self, params: SamplingParams) -> bool:
        return not params.greedy

    def settle(self, inputs: TileInputs, offered: Offered) -> Settled:
        """A pinned position (`inputs.pins`) holds its token in the draft, the sample and the next
        canvas, and counts as accepted; its entropy stays the model's."""
        draft, sampled, entropy = offered.draft, offered.proposed, offered.entropy
        if inputs.pins is not None:
            held = inputs.pins >= 0
            draft, sampled = torch.where(held, inputs.pins, draft), torch.where(held, inputs.pins, sampled)
        # ---- Phase 4: entropy-bound acceptance; re-noise the rest
        sorted_ent, sorted_idx = torch.sort(entropy, dim=-1, stable=True)
        cumsum_ent = torch.cumsum(sorted_ent, dim=-1)
        cummax_ent = torch.cummax(sorted_ent, dim=-1).values
        sorted_mask = (cumsum_ent - cummax_ent) <= inputs.entropy_bound[:, None]
        accepted = torch.zeros_like(sorted_mask).scatter_(1, sorted_idx, sorted_mask)
        if inputs.pins is not None:
            accepted |= held
        next_canvas = torch.where(accepted, sampled, offered.renoise)

        history, mean_entropy, stops = stop_test(draft, entropy, inputs)
        return Settled(draft, next_canvas, accepted, history, mean_entropy, stops | inputs.last_step, inputs.committed)


class PlannedScheduler(DenoisingScheduler):
    """A scheduler that reads a plan of `max_denoising_steps` predictor steps: the stopping rule,
    then its own `advance` of the canvas; a row that stops commits its argmax, one at its last
    predictor step its canvas."""

    @abstractmethod
    def advance(self, inputs: TileInputs, offered: Offered) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """(next canvas, accepted positions, committed positions after) of the rows' predictor step."""

    def settle(self, inputs: TileInputs, offered: Offered) -> Settled:
        draft = offered.draft if inputs.pins is None else torch.where(inputs.pins >= 0, inputs.pins, offered.draft)
        history, mean_entropy, stops = stop_test(draft, offered.entropy, inputs)
        next_canvas, accepted, committed = self.advance(inputs, offered)
        draft = torch.where((inputs.last_step & ~stops)[:, None], next_canvas, draft)
        return Settled(draft, next_canvas, accepted, history, mean_entropy, stops | inputs.last_step, committed)


class BlockRefinement(PlannedScheduler):
    def advance(self, inputs: TileInputs, offered: Offered) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        return block_refinement(offered.proposed, offered.confidence, inputs.canvas, inputs.committed, offered.renoise,
                                inputs.phases, inputs.params, inputs.pins)  # fmt: skip


class DiscreteDDIM(PlannedScheduler):
    def sweeps(self, params: SamplingParams) -> int:
        return params.corrector_steps

    def advance(self, inputs: TileInputs, offered: Offered) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        next_canvas, clean = discrete_ddim(offered.proposed, inputs.canvas, offered.renoise, inputs.rows, inputs.phases,
                                           offered.vocab_size, inputs.pins)  # fmt: skip
        return next_canvas, clean, inputs.committed


# The schedulers by name, in params.SCHEDULERS' order (diffusers 0.42.1's three for Diffusion-Gemma).
SCHEDULER_TABLE: dict[str, DenoisingScheduler] = {
    "entropy_bound": EntropyBound(),
    "block_refinement": BlockRefinement(),
    "discrete_ddim": DiscreteDDIM(),
}


def scheduler_for(params: SamplingParams) -> DenoisingScheduler:
    return SCHEDULER_TABLE[params.scheduler]


def budget(params: SamplingParams) -> tuple[int, int]:
    """(predictor steps, predictor steps followed by corrector sweeps) of a canvas: diffusers folds
    the sweeps into `max_denoising_steps` forwards, the first `corrected` steps taking
    `corrector_steps` sweeps each, so the forwards stay within the budget."""
    total, sweeps = params.max_denoising_steps, scheduler_for(params).sweeps(params)
    if sweeps == 0:
        return total, 0
    corrected = (total - 1) // (1 + sweeps)
    return total - corrected * sweeps, corrected


def phase(params: SamplingParams, forward: int) -> Phase:
    """The phase of a canvas's `forward`-th decoder forward (0-based)."""
    steps, corrected = budget(params)
    period = 1 + scheduler_for(params).sweeps(params)
    if forward < corrected * period:
        return Phase(forward // period, steps, forward % period)
    return Phase(corrected + forward - corrected * period, steps)


def block_refinement(
    proposed: torch.Tensor, confidence: torch.Tensor, canvas: torch.Tensor, committed: torch.Tensor,
    renoise: torch.Tensor, phases: list[Phase], params: list[SamplingParams], pins: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One block refinement step on rows [r, CL]: (next canvas, newly committed, committed after).
    `proposed` and `confidence` are the rows' proposed tokens and their probabilities (fp32),
    `canvas` the canvas the decoder read, `committed` the positions committed before this step."""
    device, canvas_length = canvas.device, canvas.shape[-1]
    step = torch.tensor([p.step for p in phases], device=device)
    total = torch.tensor([p.steps for p in phases], device=device)
    threshold = torch.tensor([q.commit_threshold for q in params], dtype=torch.float32, device=device)
    editing = torch.tensor([math.nan if q.editing_threshold is None else q.editing_threshold for q in params],
                           dtype=torch.float32, device=device)  # nan: no edit passes the test
    if pins is not None:
        held = pins >= 0
        proposed = torch.where(held, pins, proposed)  # a pin is committed: no edit changes it
    # The cumulative quota: an even share of the canvas per step, what is still owed committed now
    target = ((step + 1) * canvas_length + total - 1) // total
    needed = (target - committed.sum(dim=-1)).clamp(min=0)
    masked = confidence.masked_fill(committed, float("-inf"))
    ranks = masked.argsort(dim=-1, descending=True).argsort(dim=-1)
    transfer = ~committed & ((ranks < needed[:, None]) | (confidence > threshold[:, None]))
    edit = committed & (proposed != canvas) & (confidence > editing[:, None])
    after = committed | transfer
    next_canvas = torch.where(after, torch.where(transfer | edit, proposed, canvas), renoise)
    if pins is not None:
        next_canvas = torch.where(held, pins, next_canvas)
    return next_canvas, transfer, after


def settle_tile(inputs: TileInputs, offered: Offered,
                swept: tuple[list[int], torch.Tensor, torch.Tensor] | None = None) -> Settled:
    """Phases 4-6 of a tile whose rows may have any scheduler: each row's by its own scheduler (so a
    row's result depends on that row alone); `swept`: the corrector sweeps' rows and results
    (`ddim.sweep_rows`), which have no stopping test (that is their predictor step's)."""
    groups: dict[str, list[int]] = {}
    for i, row in enumerate(inputs.rows):
        if not row.sweep:
            groups.setdefault(row.scheduler, []).append(i)
    n = len(inputs.rows)
    if len(groups) == 1 and len(next(iter(groups.values()))) == n:  # one scheduler, no sweep: the usual tile
        return SCHEDULER_TABLE[next(iter(groups))].settle(inputs, offered)
    draft, device = offered.draft, offered.draft.device
    out = Settled(draft.clone(), inputs.canvas.clone(), torch.zeros_like(inputs.canvas, dtype=torch.bool),
                  inputs.history.clone(), torch.zeros(n, dtype=torch.float32, device=device),
                  torch.zeros(n, dtype=torch.bool, device=device), inputs.committed.clone())  # fmt: skip
    if swept is not None and len(swept[0]):
        where = torch.tensor(swept[0], device=device)
        out.next_canvas[where], out.accepted[where] = swept[1], swept[2]
    for name, rows in groups.items():
        index = torch.tensor(rows, device=device)
        part = SCHEDULER_TABLE[name].settle(inputs.select(rows), offered.select(index))
        for f in fields(Settled):
            getattr(out, f.name)[index] = getattr(part, f.name)
    return out


def committed_logprobs(scores, inputs: TileInputs, argmax: torch.Tensor, draft: torch.Tensor,
                       logprobs: torch.Tensor) -> torch.Tensor:
    """log p of what the raw-reading rows (block refinement's, DDIM's) commit [n, CL]: where that is not the
    argmax (their canvas at the last step, a pin), log p(argmax) + x(token) - x(argmax) on the raw
    logits (no device sync to skip it where none differs: it is a product per position)."""
    rows = [i for i, row in enumerate(inputs.rows) if row.raw and not row.sweep]
    if not rows:
        return logprobs
    index = torch.tensor(rows, device=draft.device)
    ours, theirs = draft[index], argmax[index]
    picked = (Scores(logits=scores.logits[index]) if scores.logits is not None
              else Scores(hidden=scores.hidden[index], head=scores.head))
    shift = picked.at(ours) - picked.at(theirs)
    out = logprobs.clone()
    out[index] = torch.where(ours == theirs, logprobs[index], logprobs[index] + shift)
    return out
