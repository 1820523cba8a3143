"""The vocab-chunked step: the reference step's outputs, streaming the vocabulary in chunks.

docs/design.md (chunking): the softmax statistics, the entropy, the soft embedding, the draft
and the Gumbel-max sample are accumulated chunk by chunk with online-softmax rescaling, and the
LM head (with its softcap) is applied per chunk, so no [n, CL, vocab] tensor exists. A chunk
narrower than a noise block (keyed.NOISE_BLOCK) draws the whole block and keeps its slice: more
random numbers, no more memory; the default chunk is one block.
"""

from __future__ import annotations

import functools

import torch

from dgemma.memory import plan_tiles
from dgemma.sampling.calibration import calibrate_tile
from dgemma.sampling.keyed import GUMBEL, NOISE_BLOCK, RENOISE, gumbel_noise, keyed_tokens, row_keys
from dgemma.sampling.primitives import LMHead, Scores, TileInputs, TileResult, settle

MAX_CHUNK = NOISE_BLOCK  # wider chunks buy no speed and cost memory
MIN_CHUNK = 256


class _RunningArgmax:
    """Max and first index of the max over chunks: a later chunk wins only when strictly greater."""

    def __init__(self, shape: tuple[int, ...], device: torch.device):
        self.value = torch.full(shape, float("-inf"), device=device)
        self.index = torch.zeros(shape, dtype=torch.long, device=device)

    def update(self, chunk: torch.Tensor, start: int) -> torch.Tensor:
        """Fold in `chunk` [..., width] (vocab entries start..); returns the chunk's own max."""
        chunk_max, chunk_idx = chunk.max(dim=-1)
        better = chunk_max > self.value
        self.value = torch.where(better, chunk_max, self.value)
        self.index = torch.where(better, chunk_idx + start, self.index)
        return chunk_max


class _OnlineSoftmax:
    """Running max m, s = sum exp(x - m), t = sum exp(x - m) (x - m), acc = sum exp(x - m) embed[v];
    rescaled by exp(m_old - m_new) when the max grows."""

    def __init__(self, n: int, canvas_length: int, hidden: int, device: torch.device):
        self.m = torch.full((n, canvas_length), float("-inf"), device=device)
        self.s = torch.zeros(n, canvas_length, device=device)
        self.t = torch.zeros(n, canvas_length, device=device)
        self.acc = torch.zeros(n, canvas_length, hidden, device=device)

    def update(self, scaled: torch.Tensor, chunk_max: torch.Tensor, embed: torch.Tensor) -> None:
        """Fold in a chunk of tempered logits (overwritten: they become x - m_new)."""
        m_new = torch.maximum(self.m, chunk_max)
        alpha = torch.exp(self.m - m_new)  # 0 on the first chunk (m = -inf)
        shift = torch.nan_to_num(self.m - m_new, neginf=0.0)  # m_old - m_new; 0 where nothing yet
        scaled -= m_new[..., None]
        e = torch.exp(scaled)
        self.t = alpha * (self.t + shift * self.s) + (e * scaled).sum(dim=-1)
        self.s = alpha * self.s + e.sum(dim=-1)
        self.acc = self.acc * alpha[..., None] + torch.matmul(e.to(embed.dtype), embed).float()
        self.m = m_new


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
    stochastic = [i for i, row in enumerate(inputs.rows) if not row.greedy]
    noise_keys = [inputs.rows[i].key(GUMBEL) for i in stochastic]
    rows = None if len(stochastic) == n else torch.tensor(stochastic, dtype=torch.long, device=device)

    softmax = _OnlineSoftmax(n, canvas_length, embed_weight.shape[1], device)
    best = _RunningArgmax((n, canvas_length), device)
    noisy_best = _RunningArgmax((len(stochastic), canvas_length), device)
    for start in range(0, vocab_size, chunk_size):
        stop = min(start + chunk_size, vocab_size)
        scaled = scores.chunk(start, stop) / temp
        chunk_max = best.update(scaled, start)
        if stochastic:  # Gumbel-max on the same keyed noise the reference draws, sliced to this chunk
            noisy = gumbel_noise(noise_keys, canvas_length, vocab_size, start, stop, device)
            noisy_best.update(noisy.add_(scaled if rows is None else scaled[rows]), start)
            del noisy
        softmax.update(scaled, chunk_max, embed_weight[start:stop])
        del scaled

    log_s = torch.log(softmax.s)
    entropy = log_s - softmax.t / softmax.s
    draft = best.index
    sampled = draft.clone()
    if stochastic:
        sampled[stochastic] = noisy_best.index
    renoise = keyed_tokens(row_keys(inputs.rows, RENOISE, device), canvas_length, vocab_size)
    next_canvas, accepted, history, mean_entropy, converged = settle(sampled, draft, entropy, inputs, renoise)

    soft_embeds = (softmax.acc / softmax.s[..., None] * normalizer).to(embed_weight.dtype)
    logprobs = best.value - (softmax.m + log_s)
    return TileResult(next_canvas, draft, entropy, accepted, mean_entropy, converged, history, soft_embeds, logprobs)


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
