"""The reference step: one denoising step over a tile's [n, CL, vocab] logits, eager PyTorch.

docs/design.md, phases 1-7. Its transient is what tiling bounds: the tempered logits and their
exponentials, per request, plus one request's Gumbel noise (drawn row by row); temperature,
argmax, entropy and the self-conditioning probabilities all come from one softmax.
"""

from __future__ import annotations

import torch

from dgemma.sampling.keyed import GUMBEL, RENOISE, gumbel_noise, keyed_tokens, row_keys
from dgemma.sampling.primitives import Scores, TileInputs, TileResult, settle


def reference_tile(scores: Scores, inputs: TileInputs, embed_weight: torch.Tensor, normalizer: float) -> TileResult:
    """One denoising step over a tile. Pure: reads `inputs`, returns new tensors, writes no state."""
    logits, owned = scores.full()
    n, canvas_length, vocab_size = logits.shape
    device = logits.device

    # ---- Phase 1: temperature (in place when the tile owns its logits)
    temp = inputs.temperature[:, None, None]
    scaled = logits.div_(temp) if owned else logits / temp

    # ---- Phase 2: the draft is the argmax; stochastic rows add keyed Gumbel noise, one row at a time
    top, draft = scaled.max(dim=-1)
    sampled = draft.clone()
    for i, row in enumerate(inputs.rows):
        if not row.greedy:
            noisy = gumbel_noise([row.key(GUMBEL)], canvas_length, vocab_size, 0, vocab_size, device)[0]
            sampled[i] = noisy.add_(scaled[i]).argmax(dim=-1)
            del noisy

    # ---- Phase 3: one softmax. x - max in place, e = exp(x - max), s = sum e:
    # entropy = log s - sum e (x - max) / s, and log p(draft) = -log s (the draft is the max)
    shifted = scaled.sub_(top[..., None])  # scaled is ours by now: the logits' own copy or the division's
    exp = torch.exp(shifted)
    total = exp.sum(dim=-1)
    weighted = torch.matmul(exp.view(-1, 1, vocab_size), shifted.view(-1, vocab_size, 1)).view(n, canvas_length)
    log_total = torch.log(total)
    entropy = log_total - weighted / total

    # ---- Phases 4-6: acceptance, re-noising, stability, convergence
    renoise = keyed_tokens(row_keys(inputs.rows, RENOISE, device), canvas_length, vocab_size)
    next_canvas, accepted, history, mean_entropy, converged = settle(sampled, draft, entropy, inputs, renoise)

    # ---- Phase 7: self-conditioning soft embedding (probs @ embed, [CL, hidden]) and logprobs
    probs = exp.div_(total[..., None])
    soft_embeds = torch.matmul(probs.to(embed_weight.dtype), embed_weight) * normalizer
    return TileResult(next_canvas, draft, entropy, accepted, mean_entropy, converged, history, soft_embeds, -log_total)
