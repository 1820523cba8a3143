"""The vocab-chunked step: the same outputs as `reference_tile`, streaming over vocabulary chunks.

Tiling bounds the sampler's memory by running fewer requests at once; it does not shrink the ~7
fp32 copies of [CL, vocab] each request needs. Every quantity the step needs can instead be
accumulated chunk by chunk with online-softmax rescaling (the trick flash attention uses):

    running max m and sum s = sum exp(x - m)     -> log Z = m + log s
    t = sum exp(x - m) * (x - m)                 -> entropy = log s - t / s (no cancellation)
    acc = sum exp(x - m) * embed[v]              -> soft embedding = acc / s * normalizer
    running argmax, first index on ties          -> the draft, and log p(draft) = x_draft - log Z
    running argmax of x + gumbel                 -> the sample (the same keyed noise, sliced)

and when m grows, s, t and acc are rescaled by exp(m_old - m_new). Given hidden states, the LM
head (with its softcap) is applied per chunk too, so a [n, CL, vocab] logits tensor never exists:
the transient per request is a few chunks, not the vocabulary.
"""

from __future__ import annotations

import functools

import torch

from dgemma.memory import plan_tiles
from dgemma.sampling.sampler import GUMBEL, LMHead, Scores, TileInputs, TileResult, calibrate_tile, keyed_uniform, row_keys, settle

MAX_CHUNK = 8192  # wider chunks buy no speed and cost memory
MIN_CHUNK = 256


def chunked_tile(
    scores: Scores,
    inputs: TileInputs,
    embed_weight: torch.Tensor,
    normalizer: float,
    chunk_size: int = MAX_CHUNK,
) -> TileResult:
    """One denoising step over a tile, streaming the vocabulary in chunks of `chunk_size`."""
    n, canvas_length = inputs.history.shape[0], inputs.history.shape[-1]
    vocab_size = scores.vocab_size
    device = inputs.temperature.device
    temp = inputs.temperature[:, None, None]
    sample = inputs.sample[:, None, None]
    gumbel_keys = row_keys(inputs.rows, GUMBEL, device)

    shape = (n, canvas_length)
    m = torch.full(shape, float("-inf"), device=device)
    s = torch.zeros(shape, device=device)
    t = torch.zeros(shape, device=device)
    acc = torch.zeros(n, canvas_length, embed_weight.shape[1], dtype=torch.float32, device=device)
    best = torch.full(shape, float("-inf"), device=device)
    best_idx = torch.zeros(shape, dtype=torch.long, device=device)
    noisy_best = torch.full(shape, float("-inf"), device=device)
    noisy_idx = torch.zeros(shape, dtype=torch.long, device=device)

    for start in range(0, vocab_size, chunk_size):
        stop = min(start + chunk_size, vocab_size)
        scaled = scores.chunk(start, stop) / temp

        # Running argmax: a later chunk wins only when strictly greater (first index on ties).
        chunk_idx = scaled.argmax(dim=-1, keepdim=True)
        chunk_max = scaled.gather(-1, chunk_idx).squeeze(-1)
        better = chunk_max > best
        best = torch.where(better, chunk_max, best)
        best_idx = torch.where(better, chunk_idx.squeeze(-1) + start, best_idx)

        # Gumbel-max on the same keyed noise the reference draws, sliced to this chunk.
        u = keyed_uniform(gumbel_keys, canvas_length, vocab_size, start, stop)
        noisy = scaled + -torch.log(-torch.log(u)) * sample
        del u
        noisy_chunk_idx = noisy.argmax(dim=-1, keepdim=True)
        noisy_chunk_max = noisy.gather(-1, noisy_chunk_idx).squeeze(-1)
        del noisy
        better = noisy_chunk_max > noisy_best
        noisy_best = torch.where(better, noisy_chunk_max, noisy_best)
        noisy_idx = torch.where(better, noisy_chunk_idx.squeeze(-1) + start, noisy_idx)

        # Online softmax statistics, rescaled to the new running max.
        m_new = torch.maximum(m, chunk_max)
        alpha = torch.exp(m - m_new)  # 0 on the first chunk (m = -inf)
        shift = torch.nan_to_num(m - m_new, neginf=0.0)  # m_old - m_new; 0 where nothing yet
        scaled -= m_new[..., None]  # now x - m_new, in place
        e = torch.exp(scaled)
        t = alpha * (t + shift * s) + (e * scaled).sum(dim=-1)
        s = alpha * s + e.sum(dim=-1)
        acc = acc * alpha[..., None] + torch.matmul(e.to(embed_weight.dtype), embed_weight[start:stop]).float()
        m = m_new
        del scaled, e

    log_z = m + torch.log(s)
    entropy = torch.log(s) - t / s
    mean_entropy = entropy.mean(dim=-1)
    confident = mean_entropy < inputs.confidence_threshold
    draft, sampled = best_idx, noisy_idx

    next_canvas, accepted, history, converged = settle(sampled, draft, entropy, confident, inputs, vocab_size)

    soft_embeds = (acc / s[..., None] * normalizer).to(embed_weight.dtype)
    logprobs = best - log_z
    return TileResult(next_canvas, draft, entropy, accepted, mean_entropy, confident, converged, history, soft_embeds, logprobs)


def chunk_ladder(vocab_size: int) -> list[int]:
    """Candidate chunk sizes, widest first: min(vocab, MAX_CHUNK), then halving powers of two."""
    widest = min(vocab_size, MAX_CHUNK)
    sizes, size = [widest], 1 << (widest.bit_length() - 1)
    if size == widest:
        size //= 2
    while size >= MIN_CHUNK:
        sizes.append(size)
        size //= 2
    return sizes


def choose_chunk_size(
    vocab_size: int,
    canvas_length: int,
    num_requests: int,
    free_bytes: int,
    embed_weight: torch.Tensor,
    lm_head: LMHead | None = None,
    fraction: float = 0.5,
) -> int:
    """The widest chunk whose step, for all `num_requests` in one tile, fits `fraction` of free
    memory (measured on meta tensors); the narrowest when none does (then tiles split further)."""
    ladder = chunk_ladder(vocab_size)
    for size in ladder:
        calibration = calibrate_tile(functools.partial(chunked_tile, chunk_size=size), canvas_length, vocab_size, embed_weight, lm_head)
        try:
            if plan_tiles(num_requests, free_bytes, calibration, fraction) >= num_requests:
                return size
        except torch.OutOfMemoryError:
            continue
    return ladder[-1]
