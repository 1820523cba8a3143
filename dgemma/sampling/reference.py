"""The reference step: one denoising step over a tile's [n, CL, vocab] logits, eager PyTorch.

docs/design.md, phases 1-7. Its transient is what tiling bounds: the tempered logits and their
exponentials, per request. One softmax, in vocab blocks (sampling/blocks.py), gives the draft,
the sample (the block race), the entropy and the self-conditioning probabilities.
"""

from __future__ import annotations

import torch

from dgemma.sampling.blocks import BlockRace, chunk_draft, finish_pieces, softmax_pieces
from dgemma.sampling.keyed import GUMBEL, PICK, RENOISE, keyed_tokens, row_keys
from dgemma.sampling.primitives import Scores, TileInputs, TileResult, settle


def reference_tile(scores: Scores, inputs: TileInputs, embed_weight: torch.Tensor, normalizer: float) -> TileResult:
    """One denoising step over a tile. Pure: reads `inputs`, returns new tensors, writes no state."""
    # ---- Phase 1: temperature (folded into the projection when the tile projects)
    scaled = scores.tempered(inputs.temperature)
    n, canvas_length, vocab_size = scaled.shape
    device = scaled.device

    # ---- Phases 2-3: one softmax in blocks; the draft is the argmax, stochastic rows race the blocks
    pieces, shifted = softmax_pieces(scaled)
    top, draft = chunk_draft(pieces, shifted, 0)
    sampled = draft.clone()
    stochastic = [i for i, row in enumerate(inputs.rows) if not row.greedy]
    if stochastic:
        race = BlockRace(row_keys(inputs.rows, GUMBEL, device), row_keys(inputs.rows, PICK, device), canvas_length, vocab_size)
        race.update(pieces, shifted, 0)
        sampled[stochastic] = race.sample()[stochastic]
    finish_pieces(pieces, shifted)
    del shifted, scaled
    total, weighted = pieces.rescale(top)  # exp(x - top): entropy = log s - sum e (x - top) / s
    log_total = torch.log(total)
    entropy = log_total - weighted / total

    # ---- Phases 4-6: acceptance, re-noising, stability, convergence
    renoise = keyed_tokens(row_keys(inputs.rows, RENOISE, device), canvas_length, vocab_size)
    next_canvas, accepted, history, mean_entropy, converged = settle(sampled, draft, entropy, inputs, renoise)

    # ---- Phase 7: self-conditioning soft embedding probs @ embed = (e @ embed) / s ([CL, hidden]);
    # log p(draft) = -log s (the draft is the max)
    exp = pieces.exp
    soft_embeds = torch.matmul(exp.to(embed_weight.dtype), embed_weight) * (normalizer / total[..., None]).to(embed_weight.dtype)
    return TileResult(next_canvas, draft, entropy, accepted, mean_entropy, converged, history, soft_embeds, -log_total)
