"""Block refinement and discrete DDIM: what their steps keep, commit and re-noise (docs/design.md,
the schedulers), on a tile's [n, CL] figures; the entropy bound's is `primitives.settle`.

Both read the RAW distribution (temperature 1): its argmax (the draft), its entropy (the stopping
rule), its self-conditioning embedding and, for block refinement, the confidence p(token). With
`temperature` > 0 the token each position proposes is drawn from softmax(logits / T) instead (the
block race, keyed), its confidence the tempered probability, as diffusers 0.42.1's schedulers do.

- block refinement: the canvas holds committed positions (`committed`, per slot, reset at a
  canvas's start; a pinned position counts as committed and holds its token). A step commits what
  the cumulative quota still owes (ceil((step + 1) CL / N) in all), the most confident first, plus
  every position above `commit_threshold`; with `editing_threshold` a committed token the model
  now replaces with confidence above it is edited; the rest is re-noised with keyed tokens.
- discrete DDIM: every position takes one of three routes of the uniform corruption's posterior
  q(x_s | x_t, x0) (clean: the proposed token; stay: its current token; noise: a keyed token),
  drawn from a keyed uniform. Its corrector sweeps (`corrector_steps`) are decoder forwards of
  their own, folded into the denoising budget as diffusers does (`plan`): a sweep picks
  `corrector_k` positions by Gumbel-top-k over the leave-one-out conditional's confidence and
  resamples them from it (keyed), in float64 as diffusers does.

The stopping rule is every scheduler's (`primitives.stop_test`), once per predictor step; a row
that stops commits the argmax of that step's raw logits, one that reaches its last predictor step
commits its canvas (block refinement: all committed; DDIM: the clean route everywhere).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from dgemma.sampling.keyed import RESAMPLE, ROUTE, SELECT, RowKey, keyed_categorical, keyed_uniform, row_keys
from dgemma.sampling.params import SamplingParams
from dgemma.sampling.primitives import Scores, TileInputs, settle, stop_test

# What a tile's phases 4-6 return: (draft, next canvas, accepted, history, mean entropy, converged, committed).
Settled = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]


@dataclass(frozen=True)
class Phase:
    """Where one decoder forward falls in its request's plan for a canvas."""

    step: int  # the predictor step (0-based) this forward is, or follows
    steps: int  # predictor steps per canvas (the scheduler's N)
    sweep: int = 0  # 0: the predictor step itself; j >= 1: its j-th corrector sweep

    @property
    def last(self) -> bool:
        return self.sweep == 0 and self.step >= self.steps - 1


def budget(params: SamplingParams) -> tuple[int, int]:
    """(predictor steps, predictor steps followed by corrector sweeps) of a canvas: diffusers folds
    the sweeps into `max_denoising_steps` forwards, the first `corrected` steps taking
    `corrector_steps` sweeps each, so the forwards stay within the budget."""
    total, sweeps = params.max_denoising_steps, params.corrector_steps if params.scheduler == "discrete_ddim" else 0
    if sweeps == 0:
        return total, 0
    corrected = (total - 1) // (1 + sweeps)
    return total - corrected * sweeps, corrected


def phase(params: SamplingParams, forward: int) -> Phase:
    """The phase of a canvas's `forward`-th decoder forward (0-based)."""
    steps, corrected = budget(params)
    period = 1 + (params.corrector_steps if params.scheduler == "discrete_ddim" else 0)
    if forward < corrected * period:
        return Phase(forward // period, steps, forward % period)
    return Phase(corrected + forward - corrected * period, steps)


# ---- block refinement


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


# ---- discrete DDIM: the predictor


def route_weights(canvas: torch.Tensor, proposed: torch.Tensor, phases: list[Phase], vocab_size: int) -> torch.Tensor:
    """[r, CL, 3] the posterior's route probabilities (clean, stay, noise), each row's scalars formed
    in float64 and applied in float32, in diffusers' order of operations (same figures, same bits)."""
    device = canvas.device
    scalars = []
    for p in phases:
        alpha_t, alpha_s = p.step / p.steps, (p.step + 1) / p.steps
        survival = alpha_t / alpha_s
        scalars.append([alpha_s * (1 - survival) / vocab_size, survival * alpha_s,
                        survival * (1 - alpha_s) / vocab_size, (1 - survival) * (1 - alpha_s) / vocab_size])
    base, same_weight, stay, noise = torch.tensor(scalars, dtype=torch.float32, device=device).unbind(1)
    same = (canvas == proposed).float()
    clean = same_weight[:, None] * same + base[:, None]
    ones = torch.ones_like(same)
    weights = torch.stack([clean, stay[:, None] * ones, noise[:, None] * ones], dim=-1)
    return weights / weights.sum(dim=-1, keepdim=True)


def ddim_routes(rows: list[RowKey], weights: torch.Tensor) -> torch.Tensor:
    """[r, CL] each position's route (0 clean, 1 stay, 2 noise), drawn with keyed uniforms."""
    uniform = keyed_uniform(row_keys(rows, ROUTE, weights.device), weights.shape[1])
    return keyed_categorical(weights, uniform)


def discrete_ddim(
    proposed: torch.Tensor, canvas: torch.Tensor, renoise: torch.Tensor, rows: list[RowKey], phases: list[Phase],
    vocab_size: int, pins: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One DDIM predictor step on rows [r, CL]: (next canvas, positions that took the clean route)."""
    routes = ddim_routes(rows, route_weights(canvas, proposed, phases, vocab_size))
    next_canvas = torch.where(routes == 0, proposed, canvas)
    next_canvas = torch.where(routes == 2, renoise, next_canvas)
    if pins is not None:
        next_canvas = torch.where(pins >= 0, pins, next_canvas)
    return next_canvas, routes == 0


# ---- discrete DDIM: a corrector sweep


def corrector_sweep(
    logits: torch.Tensor, canvas: torch.Tensor, rows: list[RowKey], phases: list[Phase], params: list[SamplingParams],
    pins: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One Gibbs corrector sweep on rows' raw logits [r, CL, vocab] and canvas [r, CL]: (next canvas,
    resampled positions). The conditional p_s(x | rest) = alpha_s x0_loo + (1 - alpha_s) / K is
    formed in float64 over the whole vocabulary (its leave-one-out shift reaches log K), as diffusers'."""
    r, canvas_length, vocab_size = logits.shape
    device = logits.device
    alpha = [(p.step + 1) / p.steps for p in phases]  # the corrector acts at the cleaner time s
    # The leave-one-out logits: the observed token's logit lowered by log(1 + K alpha / (1 - alpha))
    delta = [-math.log1p(vocab_size * a / (1.0 - a)) if 0.0 < a < 1.0 else 0.0 for a in alpha]
    shifted = logits.double()
    shift = torch.tensor(delta, dtype=torch.float64, device=device).view(r, 1, 1).expand(r, canvas_length, 1)
    shifted.scatter_add_(-1, canvas.unsqueeze(-1), shift.contiguous())
    loo = torch.log_softmax(shifted, dim=-1)
    del shifted
    log_alpha = torch.tensor([math.log(a) for a in alpha], dtype=torch.float64, device=device).view(r, 1, 1)
    log_uniform = torch.tensor([math.log1p(-a) - math.log(vocab_size) for a in alpha], dtype=torch.float64,
                               device=device).view(r, 1, 1)
    cond = torch.logaddexp(loo.add_(log_alpha), log_uniform.expand_as(loo))
    del loo
    positions = _select(cond, canvas, rows, params, pins)
    index = torch.arange(r, device=device)[:, None].expand_as(positions)
    chosen = cond[index, positions].exp()  # [r, k, vocab]
    uniform = keyed_uniform(row_keys(rows, RESAMPLE, device), positions.shape[1])
    resampled = keyed_categorical(chosen, uniform)
    next_canvas = canvas.clone()
    next_canvas[index, positions] = resampled
    changed = torch.zeros_like(canvas, dtype=torch.bool)
    changed[index, positions] = True
    if pins is not None:
        next_canvas = torch.where(pins >= 0, pins, next_canvas)
        changed &= pins < 0
    return next_canvas, changed


def _select(cond: torch.Tensor, canvas: torch.Tensor, rows: list[RowKey], params: list[SamplingParams],
            pins: torch.Tensor | None) -> torch.Tensor:
    """[r, k] the positions each row resamples: the least confident under its selection, by
    Gumbel-top-k at temperature tau (keyed uniforms), or the top-k of keyed scores ("random").
    A pinned position is never chosen while a free one is left."""
    r, canvas_length = canvas.shape
    k = min(max(1, params[0].corrector_k), canvas_length)  # `sweep_rows` groups rows by it
    uniform = keyed_uniform(row_keys(rows, SELECT, canvas.device), canvas_length)
    keys = torch.empty(r, canvas_length, dtype=torch.float64, device=canvas.device)
    for selection in {q.corrector_selection for q in params}:
        chosen = [i for i, q in enumerate(params) if q.corrector_selection == selection]
        which = torch.tensor(chosen, device=canvas.device)
        if selection == "random":
            keys[which] = uniform[which].double()
            continue
        c, current = cond[which], canvas[which].unsqueeze(-1)
        if selection == "lowest_maxprob":
            confidence = -c.max(dim=-1).values
        elif selection == "lowest_current_prob":
            confidence = -torch.gather(c, -1, current).squeeze(-1)
        else:  # lowest_log_margin
            log_current = torch.gather(c, -1, current).squeeze(-1)
            confidence = -(log_current - c.clone().scatter_(-1, current, float("-inf")).max(dim=-1).values)
        tau = torch.tensor([params[i].corrector_selection_tau for i in chosen], dtype=torch.float64,
                           device=canvas.device)
        u = uniform[which].clamp_(1e-12, 1.0 - 1e-12)
        keys[which] = confidence / tau[:, None] + (-torch.log(-torch.log(u)))
    if pins is not None:
        keys = keys.masked_fill(pins >= 0, float("-inf"))
    return torch.topk(keys, k=k, dim=-1).indices


def sweep_rows(inputs: TileInputs, full_logits) -> tuple[list[int], torch.Tensor, torch.Tensor]:
    """The tile's corrector-sweep rows, their next canvases and resampled positions; `full_logits(rows)`
    gives those rows' raw fp32 logits [r, CL, vocab]. Rows are swept in groups of one `corrector_k`."""
    swept = [i for i, row in enumerate(inputs.rows) if row.sweep]
    if not swept:
        return [], inputs.history[:0, 0], inputs.history[:0, 0].bool()
    order, canvases, changed = [], [], []
    for k in sorted({inputs.params[i].corrector_k for i in swept}):
        rows = [i for i in swept if inputs.params[i].corrector_k == k]
        sub = inputs.select(rows)
        canvas, moved = corrector_sweep(full_logits(rows), sub.canvas, sub.rows, sub.phases, sub.params, sub.pins)
        order += rows
        canvases.append(canvas)
        changed.append(moved)
    return order, torch.cat(canvases), torch.cat(changed)


def settle_tile(
    inputs: TileInputs, draft: torch.Tensor, proposed: torch.Tensor, confidence: torch.Tensor, entropy: torch.Tensor,
    renoise: torch.Tensor, vocab_size: int, swept: tuple[list[int], torch.Tensor, torch.Tensor] | None = None,
) -> Settled:
    """Phases 4-6 of a tile whose rows may have any scheduler: each row's by its own scheduler (so a
    row's result depends on that row alone). `draft`: the argmax of each row's distribution (the
    entropy bound's tempered one, the others' raw one); `proposed`: the token each position offers
    (the sample); `confidence`: its probability (block refinement's ranking); `swept`: the
    corrector sweeps' rows and results (`sweep_rows`)."""
    kinds = [("sweep" if row.sweep else row.scheduler) for row in inputs.rows]
    if all(kind == "entropy_bound" for kind in kinds):  # the usual tile: as it always ran
        return (*settle(proposed, draft, entropy, inputs, renoise), inputs.committed)
    n = len(kinds)
    out_draft, next_canvas = draft.clone(), inputs.canvas.clone()
    accepted = torch.zeros_like(inputs.canvas, dtype=torch.bool)
    history = inputs.history.clone()
    mean_entropy = torch.zeros(n, dtype=torch.float32, device=draft.device)
    converged = torch.zeros(n, dtype=torch.bool, device=draft.device)
    committed = inputs.committed.clone()
    for kind in dict.fromkeys(kinds):
        rows = [i for i, k in enumerate(kinds) if k == kind]
        index = torch.tensor(rows, device=draft.device)
        sub = inputs.select(rows)
        if kind == "sweep":  # no stopping test: that is its predictor step's
            order, canvas, changed = swept
            where = torch.tensor(order, device=draft.device)
            next_canvas[where], accepted[where] = canvas, changed
            continue
        if kind == "entropy_bound":
            d, nc, acc, hist, mean, conv = settle(proposed[index], draft[index], entropy[index], sub, renoise[index])
        else:
            d = draft[index] if sub.pins is None else torch.where(sub.pins >= 0, sub.pins, draft[index])
            hist, mean, stops = stop_test(d, entropy[index], sub)
            if kind == "block_refinement":
                nc, acc, committed[index] = block_refinement(
                    proposed[index], confidence[index], sub.canvas, sub.committed, renoise[index], sub.phases, sub.params,
                    sub.pins)  # fmt: skip
            else:
                nc, acc = discrete_ddim(proposed[index], sub.canvas, renoise[index], sub.rows, sub.phases, vocab_size, sub.pins)
            # A row that stops commits its argmax; one at its last predictor step its canvas
            d = torch.where((sub.last_step & ~stops)[:, None], nc, d)
            conv = stops | sub.last_step
        out_draft[index], next_canvas[index], accepted[index] = d, nc, acc
        history[index], mean_entropy[index], converged[index] = hist, mean, conv
    return out_draft, next_canvas, accepted, history, mean_entropy, converged, committed


def committed_logprobs(scores, inputs: TileInputs, argmax: torch.Tensor, draft: torch.Tensor,
                       logprobs: torch.Tensor) -> torch.Tensor:
    """log p of what block refinement's and DDIM's rows commit [n, CL]: where that is not the
    argmax (their canvas at the last step, a pin), log p(argmax) + x(token) - x(argmax) on the raw
    logits (no device sync to skip it where none differs: it is a product per position)."""
    rows = [i for i, row in enumerate(inputs.rows) if row.scheduler != "entropy_bound" and not row.sweep]
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
