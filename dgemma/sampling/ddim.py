"""Discrete DDIM's arithmetic on a tile's [r, CL] figures (docs/design.md, the schedulers): the
predictor's three routes of the uniform corruption's posterior, and the corrector sweep that
resamples a few positions from the leave-one-out conditional, in float64 as diffusers does. The
scheduler itself (its parameters, its plan) is sampling/schedulers/discrete_ddim.py."""

from __future__ import annotations

import math

import torch

from dgemma.sampling.keyed import RESAMPLE, ROUTE, SELECT, RowKey, keyed_categorical, keyed_uniform, row_keys
from dgemma.sampling.params import SamplingParams
from dgemma.sampling.primitives import Phase, TileInputs


# ---- the predictor


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


def discrete_ddim(
    proposed: torch.Tensor, canvas: torch.Tensor, renoise: torch.Tensor, rows: list[RowKey], phases: list[Phase],
    vocab_size: int, pins: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One DDIM predictor step on rows [r, CL]: (next canvas, positions that took the clean route)."""
    weights = route_weights(canvas, proposed, phases, vocab_size)
    # [r, CL] each position's route (0 clean, 1 stay, 2 noise), drawn with keyed uniforms
    routes = keyed_categorical(weights, keyed_uniform(row_keys(rows, ROUTE, weights.device), weights.shape[1]))
    next_canvas = torch.where(routes == 0, proposed, canvas)
    next_canvas = torch.where(routes == 2, renoise, next_canvas)
    if pins is not None:
        next_canvas = torch.where(pins >= 0, pins, next_canvas)
    return next_canvas, routes == 0


# ---- a corrector sweep


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
    k = min(max(1, params[0].scheduler.corrector_k), canvas_length)  # `sweep_rows` groups rows by it
    uniform = keyed_uniform(row_keys(rows, SELECT, canvas.device), canvas_length)
    keys = torch.empty(r, canvas_length, dtype=torch.float64, device=canvas.device)
    for selection in {q.scheduler.corrector_selection for q in params}:
        chosen = [i for i, q in enumerate(params) if q.scheduler.corrector_selection == selection]
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
        tau = torch.tensor([params[i].scheduler.corrector_selection_tau for i in chosen], dtype=torch.float64,
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
    for k in sorted({inputs.params[i].scheduler.corrector_k for i in swept}):
        rows = [i for i in swept if inputs.params[i].scheduler.corrector_k == k]
        sub = inputs.select(rows)
        canvas, moved = corrector_sweep(full_logits(rows), sub.canvas, sub.rows, sub.phases, sub.params, sub.pins)
        order += rows
        canvases.append(canvas)
        changed.append(moved)
    return order, torch.cat(canvases), torch.cat(changed)
