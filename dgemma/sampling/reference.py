"""The reference step: one denoising step over a tile's [n, CL, vocab] logits, eager PyTorch.

docs/design.md, phases 1-7. Its transient is what tiling bounds: the tempered logits and their
exponentials, per request. Each row computes one softmax, the way its kind of row needs it:

- a row that samples computes it in vocab blocks (sampling/blocks.py), which give the draft, the
  sample (the block race), the entropy and the self-conditioning probabilities;
- a greedy row draws no sample, so it takes torch's own softmax, the cheaper kernel (its
  exponential is faster than `torch.exp`, and it is one pass where blocks take four), and reads
  the draft, the entropy and the log-probability off it;
- a block refinement or DDIM row (sampling/schedulers/) is a greedy row at temperature 1 (they
  read the raw distribution, and block refinement ranks torch's softmax value, as diffusers does);
  with a temperature it proposes a sample of softmax(logits / T) from a second pass, the block
  race alone; a DDIM corrector sweep takes its logits whole, in float64.

Which way a row goes depends on that row alone, never on its tile-mates, so its tokens do not
either. Every pass after the projection reads and writes one position's [vocab] at a time, so a
CPU runs them over groups of positions that fit in its cache (`TileInputs.group_bytes`), writing
the soft embedding's weights over the logits: there the transient is one copy per request, not
two. A GPU takes all positions at once.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

import torch

from dgemma.sampling.blocks import BlockRace, chunk_draft, finish_pieces, per_block, softmax_pieces
from dgemma.sampling.keyed import RENOISE, keyed_tokens, row_keys
from dgemma.sampling.primitives import Scores, TileInputs, TileResult, in_position_groups
from dgemma.sampling.ddim import sweep_rows
from dgemma.sampling.schedulers import SCHEDULER_TABLE
from dgemma.sampling.schedulers.base import Offered, Settled


@dataclass
class Figures:
    """What phases 1-3 and 7 give a tile's rows: the argmax `draft`, the `sampled` proposal, the
    `entropy`, the self-conditioning `soft_embeds`, `logprobs` = log p(draft) and `confidence`,
    block refinement's ranking: p(draft) for a greedy pass (with temperature > 0
    `_tempered_samples` replaces the sample and its probability)."""

    draft: torch.Tensor
    sampled: torch.Tensor
    entropy: torch.Tensor
    soft_embeds: torch.Tensor
    logprobs: torch.Tensor
    confidence: torch.Tensor


def reference_tile(scores: Scores, inputs: TileInputs, embed_weight: torch.Tensor, normalizer: float) -> TileResult:
    """One denoising step over a tile. Pure: reads `inputs`, returns new tensors, writes no state."""
    n = inputs.history.shape[0]
    device = inputs.temperature.device

    # ---- Phases 1-3 and 7's probabilities, greedy rows and sampling rows each their own way
    # (block refinement and DDIM rows read the raw distribution: greedy rows at temperature 1;
    # a corrector sweep reads its logits whole, below)
    greedy = [i for i, row in enumerate(inputs.rows) if row.greedy_pass and not row.sweep]
    sampling = [i for i, row in enumerate(inputs.rows) if not row.greedy_pass and not row.sweep]
    parts = [(rows, kind(scores, inputs, None if len(rows) == n else rows, embed_weight, normalizer))
             for rows, kind in ((greedy, _greedy_rows), (sampling, _sampling_rows)) if rows]  # fmt: skip
    figures = _in_tile_order(parts, n, inputs, embed_weight, device)
    tempered = [i for i, row in enumerate(inputs.rows) if row.tempered]
    if tempered:  # raw-reading rows (block refinement, DDIM) with temperature > 0 propose a sample of softmax(logits / T)
        index = torch.tensor(tempered, device=device)
        figures = replace(figures, sampled=figures.sampled.clone(), confidence=figures.confidence.clone())
        figures.sampled[index], figures.confidence[index] = _tempered_samples(scores, inputs, tempered)
    return settled(scores, inputs, figures)


def settled(scores: Scores, inputs: TileInputs, figures: Figures) -> TileResult:
    """Phases 4-6 of either step (acceptance, re-noising, stability, convergence; each row by its
    scheduler, corrector sweeps on their rows' whole logits) and its result, from phases 1-3 and 7's
    `figures`."""
    draft = figures.draft
    renoise = keyed_tokens(row_keys(inputs.rows, RENOISE, draft.device), draft.shape[-1], scores.vocab_size)
    swept = sweep_rows(inputs, lambda rows: raw_logits(scores, inputs, rows))
    offered = Offered(draft, figures.sampled, figures.confidence, figures.entropy, renoise, scores.vocab_size)
    out = settle_tile(inputs, offered, swept)
    logprobs = committed_logprobs(scores, inputs, draft, out.draft, figures.logprobs)
    return TileResult(out.next_canvas, out.draft, figures.entropy, out.accepted, out.mean_entropy, out.converged,
                      out.history, figures.soft_embeds, logprobs, out.committed)


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
    picked = scores.select(index)
    shift = picked.at(ours) - picked.at(theirs)
    out = logprobs.clone()
    out[index] = torch.where(ours == theirs, logprobs[index], logprobs[index] + shift)
    return out


def raw_logits(scores: Scores, inputs: TileInputs, rows: list[int]) -> torch.Tensor:
    """The rows' fp32 logits [r, CL, vocab], softcapped, untempered (their temperature is 1)."""
    logits, temper = scores.tempered_by_rows(inputs.temperature, 0, None, rows)
    temper(0, logits.shape[0] * logits.shape[1])
    return logits


def _tempered_samples(scores: Scores, inputs: TileInputs, rows: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows' samples of softmax(logits / T) by the block race (keyed) and their probabilities [r, CL]."""
    race, tempered = tempered_race(scores, inputs, rows)

    def positions(scaled: torch.Tensor, span: slice) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
        pieces, shifted = softmax_pieces(scaled)
        top, _ = chunk_draft(pieces.block_max, shifted, 0)
        race.update(pieces, shifted, 0, span)
        return (top, pieces.total_at(top)), pieces.exp

    (top, total), _ = in_position_groups(scores, tempered, rows, positions)
    sample, logit = race.sample_with_logit()
    return sample.view(top.shape), torch.exp(logit.view(top.shape) - top - torch.log(total))


def tempered_race(scores: Scores, inputs: TileInputs, rows: list[int]) -> tuple[BlockRace, TileInputs]:
    """The block race of block refinement's and DDIM's tile rows `rows` (temperature > 0), and the
    tile's inputs with those rows at their own temperature."""
    device = inputs.temperature.device
    keys = [inputs.rows[i] for i in rows]
    race = BlockRace(keys, inputs.history.shape[-1], scores.vocab_size, device)
    temperature = torch.tensor([inputs.params[i].scheduler.temperature for i in rows], dtype=torch.float32, device=device)
    index = torch.tensor(rows, device=device)
    return race, replace(inputs, temperature=inputs.temperature.clone().index_copy_(0, index, temperature))


def _sampling_rows(scores: Scores, inputs: TileInputs, rows: list[int] | None, embed_weight: torch.Tensor, normalizer: float) -> Figures:
    """Rows that sample: the softmax in vocab blocks; the draft is its argmax, the sample the block race."""
    keys = inputs.rows if rows is None else [inputs.rows[i] for i in rows]
    race = BlockRace(keys, inputs.history.shape[-1], scores.vocab_size, inputs.temperature.device)

    def positions(scaled: torch.Tensor, span: slice) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
        # ---- Phases 2-3: one softmax in blocks; the draft is the argmax, the sample the block race
        pieces, shifted = softmax_pieces(scaled)
        top, draft = chunk_draft(pieces.block_max, shifted, 0)
        race.update(pieces, shifted, 0, span)
        finish_pieces(pieces, shifted)
        total, weighted = pieces.rescale(top)  # exp(x - top): entropy = log s - sum e (x - top) / s
        log_total = torch.log(total)
        entropy = log_total - weighted / total
        return (draft, entropy, total, log_total), pieces.exp

    (draft, entropy, total, log_total), exp = in_position_groups(scores, inputs, rows, positions)
    # ---- Phase 7: self-conditioning soft embedding probs @ embed = (e @ embed) / s ([CL, hidden]);
    # log p(draft) = -log s (the draft is the max)
    sampled = race.sample().view(draft.shape)
    return Figures(draft, sampled, entropy, _soft_embeds(exp, total, embed_weight, normalizer), -log_total, torch.exp(-log_total))


def _greedy_rows(scores: Scores, inputs: TileInputs, rows: list[int] | None, embed_weight: torch.Tensor, normalizer: float) -> Figures:
    """Greedy rows: torch's softmax; the draft (and the sample) is the argmax of the logits."""
    (draft, entropy, mass, log_p_draft, p_draft), probs = in_position_groups(scores, inputs, rows, _greedy_positions)
    # ---- Phase 7: self-conditioning soft embedding probs @ embed ([CL, hidden])
    return Figures(draft, draft, entropy, _soft_embeds(probs, mass, embed_weight, normalizer), log_p_draft, p_draft)


def _greedy_positions(scaled: torch.Tensor, span: slice) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
    """Phases 2-3 for greedy rows' tempered logits [positions, vocab]: ((draft, entropy, mass,
    log p(draft), p(draft) as torch's softmax gives it), probabilities). The last is block
    refinement's confidence, which it ranks: the same bits as diffusers' (torch.softmax), so ties
    break alike."""
    # The draft, as the sampling rows find it (the first block holding the max, its first entry
    # at the max), then the probabilities of x - max <= 0
    top, draft = chunk_draft(per_block(scaled, torch.amax), scaled, 0)
    shifted = scaled.sub_(top[..., None])
    probs = torch.softmax(shifted, dim=-1)
    # torch's softmax divides by one fp32 sum over the whole row (off by parts in 1e5 at vocab
    # 262,144); sums per block are good to fp32's 1e-7, so the figures below are normalised by theirs.
    mass = per_block(probs, torch.sum).sum(dim=-1)
    # entropy = -sum p log p = log S - sum p (x - max), S = sum exp(x - max) = 1 / p(draft): two
    # terms >= 0, so no cancellation. An entry of -inf adds 0 x -inf = nan: its true term is 0.
    weighted = per_block(shifted.mul_(probs), torch.sum).nan_to_num_(nan=0.0).sum(dim=-1)
    p_draft = probs.gather(-1, draft[..., None]).squeeze(-1)
    log_p_draft = torch.log(p_draft / mass)
    entropy = -log_p_draft - weighted / mass
    return (draft, entropy, mass, log_p_draft, p_draft), probs


def _soft_embeds(weights: torch.Tensor, total: torch.Tensor, embed_weight: torch.Tensor, normalizer: float) -> torch.Tensor:
    """The self-conditioning embedding [n, CL, hidden]: (weights / total) @ embed x normalizer,
    the division applied to the [n, CL, hidden] product rather than the [n, CL, vocab] weights."""
    return torch.matmul(weights.to(embed_weight.dtype), embed_weight) * (normalizer / total[..., None]).to(embed_weight.dtype)


def _in_tile_order(parts: list[tuple[list[int], Figures]], n: int, inputs: TileInputs, embed_weight: torch.Tensor,
                   device: torch.device) -> Figures:
    """The kinds' outputs as whole-tile tensors, rows back in tile order; a corrector sweep's row
    (in no part) reads its canvas as its draft and zeros (its state keeps its predictor's)."""
    if len(parts) == 1 and len(parts[0][0]) == n:
        return parts[0][1]
    canvas_length = inputs.history.shape[-1]
    like = inputs.canvas if inputs.canvas is not None else torch.zeros(n, canvas_length, dtype=torch.long, device=device)
    out = Figures(like.clone(), like.clone(), torch.zeros(n, canvas_length, device=device),
                  torch.zeros(n, canvas_length, embed_weight.shape[1], dtype=embed_weight.dtype, device=device),
                  torch.zeros(n, canvas_length, device=device), torch.zeros(n, canvas_length, device=device))
    for rows, part in parts:
        index = torch.tensor(rows, device=device)
        for f in fields(Figures):
            whole = getattr(out, f.name)
            whole[index] = getattr(part, f.name).to(whole.dtype)
    return out
