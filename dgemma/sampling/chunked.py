"""The vocab-chunked step: the reference step's outputs, streaming the vocabulary in chunks.

docs/design.md (chunking): the softmax statistics, the entropy, the soft embedding, the draft
and the block race's winner are accumulated chunk by chunk with online-softmax rescaling, and
the LM head (with its softcap) is applied per chunk, so no [n, CL, vocab] tensor exists. Chunks
hold whole vocab blocks (sampling/blocks.py), so every block's figures are the reference's, bit
for bit; a chunk size is rounded down to a multiple of `BLOCK` (at least one block).
"""

from __future__ import annotations

import functools

import torch

from dgemma.memory import plan_tiles
from dgemma.sampling.blocks import BLOCK, BlockRace, Pieces, RunningArgmax, chunk_draft, finish_pieces, race_noise, softmax_pieces
from dgemma.sampling.calibration import calibrate_tile
from dgemma.sampling.keyed import RENOISE, keyed_tokens, row_keys
from dgemma.sampling.primitives import LMHead, Scores, TileInputs, TileResult, settle

MAX_CHUNK = 128 * BLOCK  # narrower chunks pay per-op overhead; wider ones cost memory
MIN_CHUNK = BLOCK


class _OnlineSoftmax:
    """Running max m, s = sum exp(x - m), t = sum exp(x - m) (x - m), acc = sum exp(x - m) embed[v];
    rescaled by exp(m_old - m_new) when the max grows."""

    def __init__(self, n: int, canvas_length: int, hidden: int, device: torch.device):
        self.m = torch.full((n, canvas_length), float("-inf"), device=device)
        self.s = torch.zeros(n, canvas_length, device=device)
        self.t = torch.zeros(n, canvas_length, device=device)
        self.acc = torch.zeros(n, canvas_length, hidden, device=device)

    def update(self, pieces: Pieces, chunk_max: torch.Tensor, embed: torch.Tensor) -> None:
        """Fold in a chunk's block pieces (their exponentials are rescaled in place)."""
        m_new = torch.maximum(self.m, chunk_max)
        alpha = torch.exp(self.m - m_new)  # 0 on the first chunk (m = -inf)
        shift = torch.nan_to_num(self.m - m_new, neginf=0.0)  # m_old - m_new; 0 where nothing yet
        s, t = pieces.rescale(m_new)
        self.t = alpha * (self.t + shift * self.s) + t
        self.s = alpha * self.s + s
        self.acc = self.acc * alpha[..., None] + torch.matmul(pieces.exp.to(embed.dtype), embed).float()
        self.m = m_new


def chunked_tile(
    scores: Scores,
    inputs: TileInputs,
    embed_weight: torch.Tensor,
    normalizer: float,
    chunk_size: int = MAX_CHUNK,
) -> TileResult:
    """One denoising step over a tile, streaming the vocabulary in chunks of `chunk_size`
    (rounded down to whole blocks)."""
    n, canvas_length = inputs.history.shape[0], inputs.history.shape[-1]
    vocab_size = scores.vocab_size
    device = inputs.temperature.device
    width = max(BLOCK, chunk_size - chunk_size % BLOCK)
    stochastic = [i for i, row in enumerate(inputs.rows) if not row.greedy]
    race = None
    if stochastic:
        race = BlockRace(*race_noise(inputs.rows, canvas_length, vocab_size, device), vocab_size)

    softmax = _OnlineSoftmax(n, canvas_length, embed_weight.shape[1], device)
    best = RunningArgmax((n, canvas_length), device)
    for start in range(0, vocab_size, width):
        stop = min(start + width, vocab_size)
        pieces, shifted = softmax_pieces(scores.tempered(inputs.temperature, start, stop))
        chunk_max, chunk_argmax = chunk_draft(pieces.block_max, shifted, start)
        best.update(chunk_max, chunk_argmax)
        if race is not None:
            race.update(pieces, shifted, start)
        finish_pieces(pieces, shifted)
        del shifted
        softmax.update(pieces, chunk_max, embed_weight[start:stop])
        del pieces

    log_s = torch.log(softmax.s)
    entropy = log_s - softmax.t / softmax.s
    draft = best.index
    sampled = draft.clone()
    if race is not None:
        sampled[stochastic] = race.sample()[stochastic]
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
