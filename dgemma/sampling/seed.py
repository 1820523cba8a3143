"""The seed's eager step: the design we improve on, re-stated as a plain function for baselines.

The source's sampler step in plain PyTorch, in its order, with one global-RNG Gumbel draw (so
its tokens depend on the batch and the tiling, unlike ours) and every intermediate kept alive:
its peak holds 7 fp32 copies of [n, CL, vocab] (docs/design.md, the memory arithmetic). It has
the signature of the reference step, so `calibrate_tile(seed_tile, ...)` measures it too; the
benchmark (`python -m dgemma.bench sampler --baseline seed`) and the what-if planner use it.
"""

from __future__ import annotations

import torch

from dgemma.sampling.primitives import Scores, TileInputs, TileResult
from dgemma.sampling.schedulers import EntropyBound
from dgemma.sampling.schedulers.base import Offered


def seed_tile(scores: Scores, inputs: TileInputs, embed_weight: torch.Tensor, normalizer: float) -> TileResult:
    """One denoising step over a tile, as the seed runs it (global RNG, no copy released early)."""
    logits = scores.full()
    n, canvas_length, vocab_size = logits.shape
    device = logits.device
    sample = torch.tensor([0.0 if r.greedy else 1.0 for r in inputs.rows], device=device)

    # Phases 1-2: temperature, one global Gumbel draw, Gumbel-max sample and argmax draft
    scaled = logits / inputs.temperature[:, None, None]
    u = torch.rand(n, canvas_length, vocab_size, device=device)
    gumbel = -torch.log(-torch.log(u))
    noisy = scaled + gumbel * sample[:, None, None]
    sampled = noisy.argmax(dim=-1)
    draft = scaled.argmax(dim=-1)

    # Phase 3: log-softmax, probabilities, entropy
    log_probs = scaled.log_softmax(dim=-1)
    probs = log_probs.exp()
    entropy = -(probs * log_probs).sum(dim=-1)

    # Phases 4-6 (re-noise from the global stream too), phase 7: self-conditioning and logprobs
    renoise = torch.randint(vocab_size, (n, canvas_length), device=device)
    out = EntropyBound().settle(inputs, Offered(draft, sampled, None, entropy, renoise, vocab_size))
    soft_embeds = torch.matmul(probs.to(embed_weight.dtype), embed_weight) * normalizer
    logprobs = log_probs.gather(-1, out.draft[..., None]).squeeze(-1)
    return TileResult(out.next_canvas, out.draft, entropy, out.accepted, out.mean_entropy, out.converged, out.history,
                      soft_embeds, logprobs)
