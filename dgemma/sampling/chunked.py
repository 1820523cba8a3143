"""The vocab-chunked step: the reference step's outputs, streaming the vocabulary in chunks.

docs/design.md (chunking): the softmax statistics, the entropy, the soft embedding, the draft
and the block race's winner are accumulated chunk by chunk with online-softmax rescaling, and
the LM head (with its softcap) is applied per chunk, so no [n, CL, vocab] tensor exists. Chunks
hold whole vocab blocks (sampling/blocks.py), so every block's figures are the reference's, bit
for bit; a chunk size is rounded down to a multiple of `BLOCK` (at least one block).

Block refinement's and discrete DDIM's rows stream too: their raw distribution is a greedy row's
at temperature 1, and a temperature's sample (and its probability) a second streamed pass. Two
parts have no streamed form here. A DDIM corrector sweep takes its rows' logits whole, in float64:
it ranks every position by its whole leave-one-out conditional and draws from a chosen position's
whole conditional, bit for bit as diffusers does (a streamed form needs a float64 running
log-sum-exp and a second pass for the chosen positions). And block refinement's confidence here
is p(draft) from the streamed sums, equal to the reference's torch.softmax value up to rounding,
so where two positions' confidences tie in fp32 the two steps may commit them in another order
(on the embedded model's held-out prompts they commit alike: tests/test_diffusers_agreement.py).
"""

from __future__ import annotations

import functools

import torch

from dgemma.memory import plan_tiles
from dgemma.sampling.blocks import BLOCK, BlockRace, Pieces, RunningArgmax, chunk_draft, finish_pieces, softmax_pieces
from dgemma.sampling.calibration import calibrate_tile
from dgemma.sampling.primitives import LMHead, Scores, TileInputs, TileResult, in_position_groups
from dgemma.sampling.reference import Figures, settled, tempered_race

MAX_CHUNK = 128 * BLOCK  # narrower chunks pay per-op overhead; wider ones cost memory
MIN_CHUNK = BLOCK


class _OnlineSoftmax:
    """Running max m, s = sum exp(x - m), t = sum exp(x - m) (x - m), acc = sum exp(x - m) embed[v],
    per position ([n x CL] flattened); rescaled by exp(m_old - m_new) when the max grows."""

    def __init__(self, positions: int, hidden: int, device: torch.device):
        self.m = torch.full((positions,), float("-inf"), device=device)
        self.s = torch.zeros(positions, device=device)
        self.t = torch.zeros(positions, device=device)
        self.alpha = torch.zeros(positions, device=device)  # this chunk's exp(m_old - m_new), for acc
        self.acc = torch.zeros(positions, hidden, device=device)

    def update(self, pieces: Pieces, chunk_max: torch.Tensor, rows: slice) -> None:
        """Fold in a chunk's block pieces for positions `rows` (their exponentials are rescaled
        in place to the new max); `accumulate` then folds in the chunk's soft embedding."""
        m = self.m[rows]
        m_new = torch.maximum(m, chunk_max)
        alpha = torch.exp(m - m_new)  # 0 on the first chunk (m = -inf)
        shift = torch.nan_to_num(m - m_new, neginf=0.0)  # m_old - m_new; 0 where nothing yet
        s, t = pieces.rescale(m_new)
        self.t[rows] = alpha * (self.t[rows] + shift * self.s[rows]) + t
        self.s[rows] = alpha * self.s[rows] + s
        self.alpha[rows] = alpha
        self.m[rows] = m_new

    def accumulate(self, exp: torch.Tensor, embed: torch.Tensor) -> None:
        """acc <- acc x alpha + exp @ embed for the chunk's rescaled exponentials [positions, width]."""
        self.acc = self.acc * self.alpha[..., None] + torch.matmul(exp.to(embed.dtype), embed).float()


def chunked_tile(scores: Scores, inputs: TileInputs, embed_weight: torch.Tensor, normalizer: float,
                 chunk_size: int = MAX_CHUNK) -> TileResult:
    """One denoising step over a tile, streaming the vocabulary in chunks of `chunk_size`
    (rounded down to whole blocks), each chunk's positions a group at a time
    (`in_position_groups`: in a CPU's cache, the exponentials written over the chunk's logits)."""
    n, canvas_length = inputs.history.shape[0], inputs.history.shape[-1]
    vocab_size = scores.vocab_size
    device = inputs.temperature.device
    width = max(BLOCK, chunk_size - chunk_size % BLOCK)
    # Only the entropy bound's sampling rows race here; block refinement and DDIM rows read the raw
    # distribution (temperature 1) and, with a temperature, race in a pass of their own
    stochastic = [i for i, row in enumerate(inputs.rows) if not row.greedy_pass]
    race = BlockRace(inputs.rows, canvas_length, vocab_size, device) if stochastic else None

    softmax = _OnlineSoftmax(n * canvas_length, embed_weight.shape[1], device)
    best = RunningArgmax((n * canvas_length,), device)
    for start in range(0, vocab_size, width):
        stop = min(start + width, vocab_size)

        def positions(scaled: torch.Tensor, span: slice) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
            pieces, shifted = softmax_pieces(scaled)
            chunk_max, chunk_argmax = chunk_draft(pieces.block_max, shifted, start)
            best.update(chunk_max, chunk_argmax, span)
            if race is not None:
                race.update(pieces, shifted, start, span)
            finish_pieces(pieces, shifted)
            softmax.update(pieces, chunk_max, span)
            return (), pieces.exp

        _, exp = in_position_groups(scores, inputs, None, positions, start, stop)
        softmax.accumulate(exp.flatten(0, 1), embed_weight[start:stop])
        del exp

    log_s = torch.log(softmax.s)
    entropy = (log_s - softmax.t / softmax.s).view(n, canvas_length)
    draft = best.index.view(n, canvas_length)
    sampled = draft.clone()
    if race is not None:
        sampled[stochastic] = race.sample().view(n, canvas_length)[stochastic]
    logprobs = (best.value - (softmax.m + log_s)).view(n, canvas_length)
    confidence = torch.exp(logprobs)  # block refinement's: p(draft), from the streamed sums
    tempered = [i for i, row in enumerate(inputs.rows) if row.tempered]
    if tempered:
        index = torch.tensor(tempered, device=device)
        sampled[index], confidence[index] = _tempered_samples(scores, inputs, tempered, width)
    soft_embeds = (softmax.acc / softmax.s[..., None] * normalizer).to(embed_weight.dtype).view(n, canvas_length, -1)
    # A corrector sweep's rows take their logits whole there: it has no streamed form (above)
    return settled(scores, inputs, Figures(draft, sampled, entropy, soft_embeds, logprobs, confidence))


def _tempered_samples(scores: Scores, inputs: TileInputs, rows: list[int], width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`reference._tempered_samples`, streaming the vocabulary: the race and the running max and mass."""
    race, tempered = tempered_race(scores, inputs, rows)
    positions_total = len(rows) * inputs.history.shape[-1]
    device = inputs.temperature.device
    m = torch.full((positions_total,), float("-inf"), device=device)
    s = torch.zeros(positions_total, device=device)
    for start in range(0, scores.vocab_size, width):

        def positions(scaled: torch.Tensor, span: slice) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
            pieces, shifted = softmax_pieces(scaled)
            chunk_max, _ = chunk_draft(pieces.block_max, shifted, start)
            race.update(pieces, shifted, start, span)
            m_new = torch.maximum(m[span], chunk_max)
            s[span] = s[span] * torch.exp(m[span] - m_new) + pieces.total_at(m_new)
            m[span] = m_new
            return (), pieces.exp

        in_position_groups(scores, tempered, rows, positions, start, min(start + width, scores.vocab_size))
    sample, logit = race.sample_with_logit()
    shape = (len(rows), inputs.history.shape[-1])
    return sample.view(shape), torch.exp(logit - m - torch.log(s)).view(shape)


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


def choose_chunk_size(vocab_size: int, canvas_length: int, num_requests: int, free_bytes: int, embed_weight: torch.Tensor,
                      lm_head: LMHead | None = None, fraction: float = 0.5) -> int:
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
