"""The step's one softmax, computed in fixed vocab blocks, and the sample drawn from it.

docs/design.md (sampling by block race). The vocabulary is cut into blocks of `BLOCK` entries
(the last may be shorter). Each block is shifted by its own maximum before the exponential, so
a block's figures (its maximum m_b, its mass S_b = sum exp(x - m_b)) come from its own entries
only, computed the same way whether the vocabulary arrives whole (the reference step) or in
chunks of whole blocks (the chunked step). The sample is then exact and cheap:

- the block race: block b wins with probability proportional to its mass exp(m_b) S_b, by
  Gumbel-max over the blocks (argmax of m_b + log S_b + keyed Gumbel noise): one random number
  per block, not per token;
- the pick: inside the winning block, the token whose cumulative mass first passes a keyed
  uniform's share of the block's mass (inverse CDF over `BLOCK` entries).

P(token) = P(its block) x P(token | block) = softmax(x)[token]. The softmax statistics for the
entropy and the self-conditioning embedding come from the same exponentials, rescaled per block
to a common shift (`Pieces.rescale`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from dgemma.sampling.keyed import GUMBEL, PICK, RowKey, keyed_block_gumbel, keyed_uniform, row_keys

BLOCK = 256  # vocab entries per block (the chunked step's narrowest chunk: chunks hold whole blocks)


def num_blocks(width: int) -> int:
    """Vocab blocks covering `width` entries (the last may be short)."""
    return -(-width // BLOCK)


def per_block(t: torch.Tensor, reduce: Callable[..., torch.Tensor]) -> torch.Tensor:
    """reduce(view [..., blocks, BLOCK], dim=-1) over full blocks, with the short last block's own."""
    width = t.shape[-1]
    full = width - width % BLOCK
    parts = [reduce(t[..., :full].unflatten(-1, (full // BLOCK, BLOCK)), dim=-1)] if full else []
    if full < width:
        parts.append(reduce(t[..., full:], dim=-1, keepdim=True))
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=-1)


def _apply_per_block(t: torch.Tensor, per_block: torch.Tensor, op: str) -> torch.Tensor:
    """t.<op>_(each block's value of per_block [..., blocks]) in place, broadcast over the block."""
    width = t.shape[-1]
    full = width - width % BLOCK
    if full:
        getattr(t[..., :full].unflatten(-1, (full // BLOCK, BLOCK)), op)(per_block[..., : full // BLOCK, None])
    if full < width:
        getattr(t[..., full:], op)(per_block[..., -1:])
    return t


@dataclass
class Pieces:
    """One chunk's softmax pieces, per (row, position, block): its maximum, mass and entropy term."""

    block_max: torch.Tensor  # [n, CL, blocks] m_b (-inf for a block of -inf)
    mass: torch.Tensor  # [n, CL, blocks] S_b = sum exp(x - m_b)
    weighted: torch.Tensor | None  # [n, CL, blocks] sum exp(x - m_b) (x - m_b) (finish_pieces)
    exp: torch.Tensor  # [n, CL, width] exp(x - m_b), then (rescale) exp(x - shift)

    def rescale(self, shift: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Bring the exponentials to one shift [n, CL] (in place) and return the chunk's
        (sum exp(x - shift), sum exp(x - shift) (x - shift)), each [n, CL]."""
        gap = self.block_max - shift[..., None]  # <= 0 when shift is at least the chunk's max
        scale = torch.exp(gap)  # 0 for a block of -inf
        gap = torch.nan_to_num(gap, neginf=0.0)
        _apply_per_block(self.exp, scale, "mul_")
        total = (scale * self.mass).sum(dim=-1)
        weighted = (scale * (self.weighted + gap * self.mass)).sum(dim=-1)
        return total, weighted


    def total_at(self, shift: torch.Tensor) -> torch.Tensor:
        """sum exp(x - shift) [n, CL] over the chunk (the exponentials untouched): the mass a
        sample's probability is read against."""
        return (torch.exp(self.block_max - shift[..., None]) * self.mass).sum(dim=-1)


def softmax_pieces(scaled: torch.Tensor) -> tuple[Pieces, torch.Tensor]:
    """Block pieces of tempered logits `scaled` [n, CL, width] (a whole number of blocks but for
    the vocabulary's last), and the blocks' shifted values x - m_b (`scaled`, overwritten)."""
    block_max = per_block(scaled, torch.amax)
    safe_max = torch.nan_to_num(block_max, neginf=0.0)  # a block of -inf stays -inf, not nan
    shifted = _apply_per_block(scaled, safe_max, "sub_")
    exp = torch.exp(shifted)
    mass = per_block(exp, torch.sum)
    return Pieces(block_max, mass, None, exp), shifted


def finish_pieces(pieces: Pieces, shifted: torch.Tensor) -> None:
    """The entropy terms per block (overwrites `shifted` with exp(x - m_b) (x - m_b))."""
    weighted = per_block(shifted.mul_(pieces.exp), torch.sum)
    # an entry of -inf adds exp 0 x -inf = nan: its true term is 0 (nan logits stay nan in the mass)
    pieces.weighted = weighted.nan_to_num_(nan=0.0, posinf=float("inf"), neginf=float("-inf"))


class RunningArgmax:
    """Max and first index of the max over chunks: a later chunk wins only when strictly greater.
    Its state is per position; an update may cover a span of them (`rows`, written in place)."""

    def __init__(self, shape: tuple[int, ...], device: torch.device):
        self.value = torch.full(shape, float("-inf"), device=device)
        self.index = torch.zeros(shape, dtype=torch.long, device=device)

    def update(self, value: torch.Tensor, index: torch.Tensor, rows: slice = slice(None)) -> torch.Tensor:
        """Fold in a chunk's max `value` at `index` for positions `rows`; returns where it won."""
        better = value > self.value[rows]
        self.value[rows] = torch.where(better, value, self.value[rows])
        self.index[rows] = torch.where(better, index, self.index[rows])
        return better


def gather_block(shifted: torch.Tensor, block: torch.Tensor, span: int = BLOCK) -> torch.Tensor:
    """The first `span` (<= BLOCK) entries [n, CL, span] of chunk-local block `block` [n, CL] of
    `shifted` [n, CL, width]; entries past the chunk's end (a short last block) read -inf."""
    width = shifted.shape[-1]
    index = block[..., None] * BLOCK + torch.arange(span, device=block.device)
    if width % BLOCK == 0:  # whole blocks only (every chunk but a vocabulary's short last one)
        return torch.gather(shifted, -1, index)
    values = torch.gather(shifted, -1, index.clamp(max=width - 1))
    return values.masked_fill_(index >= width, float("-inf"))


def chunk_draft(block_max: torch.Tensor, values: torch.Tensor, start: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The chunk's max value [n, CL] and the vocab id of its first occurrence (the draft's
    candidate), from its blocks' maxima [n, CL, blocks] and its logits `values` [n, CL, width]
    (as they are, or shifted by their block's max: either way no other entry ties the max): the
    first block holding the max, then the first entry of it that is the max."""
    value, block = block_max.max(dim=-1)
    within = gather_block(values, block, min(BLOCK, values.shape[-1])).argmax(dim=-1)
    return value, start + block * BLOCK + within


class BlockRace:
    """The sample, over chunks: the running winner of the block race (its score, its vocab block
    and its shifted values), then the pick inside it. Its state is per position ([positions],
    a tile's [n, CL] flattened); an update may cover a span of them."""

    def __init__(self, rows: Sequence[RowKey], canvas_length: int, vocab_size: int, device: torch.device):
        """The race of `rows`' n x CL positions, its noise keyed by (seed, canvas, step): every block's
        Gumbel noise [positions, vocab / BLOCK] and the pick's uniform [positions]. All blocks in one
        draw: it is 1/BLOCK of a copy, and drawing it per chunk cost some 25 small ops a chunk (each a
        wait for every thread)."""
        noise = keyed_block_gumbel(row_keys(rows, GUMBEL, device), canvas_length, 0, num_blocks(vocab_size))
        self.noise = noise.flatten(0, 1)
        self.uniform = keyed_uniform(row_keys(rows, PICK, device), canvas_length).flatten()
        positions = self.noise.shape[0]
        self.span = min(BLOCK, vocab_size)  # a block's widest (a vocabulary smaller than a block: all of it)
        self.best = RunningArgmax((positions,), device)
        self.values = torch.full((positions, self.span), float("-inf"), device=device)
        self.winner_max = torch.full((positions,), float("-inf"), device=device)  # the winning block's max

    def update(self, pieces: Pieces, shifted: torch.Tensor, start: int, rows: slice = slice(None)) -> None:
        """Fold in a chunk (vocab entries start.., start a multiple of BLOCK) of positions `rows`:
        every row races, greedy ones too (per-block figures only: cheaper than taking the rows apart)."""
        first = start // BLOCK
        noise = self.noise[rows, first : first + pieces.block_max.shape[-1]]
        score, block = (pieces.block_max + pieces.mass.log() + noise).max(dim=-1)
        better = self.best.update(score, block + first, rows)
        self.values[rows] = torch.where(better[..., None], gather_block(shifted, block, self.span), self.values[rows])
        self.winner_max[rows] = torch.where(better, pieces.block_max.gather(-1, block[..., None]).squeeze(-1),
                                            self.winner_max[rows])

    def sample(self) -> torch.Tensor:
        """Token ids [positions]: in the winning block, the first entry whose cumulative mass
        passes u x the block's mass (never an entry of zero mass)."""
        return self.sample_with_logit()[0]

    def sample_with_logit(self) -> tuple[torch.Tensor, torch.Tensor]:
        """`sample()` and each sampled token's (tempered) logit [positions]."""
        cumulative = torch.cumsum(torch.exp(self.values), dim=-1)
        total = cumulative[..., -1:]
        target = self.uniform[..., None] * total
        within = torch.searchsorted(cumulative, target, right=True)
        last = torch.searchsorted(cumulative, total.contiguous())  # the last entry with mass: where the sum is reached
        within = torch.minimum(within, last).clamp_(max=self.span - 1).squeeze(-1)
        logit = self.values.gather(-1, within[..., None]).squeeze(-1) + self.winner_max
        return self.best.index * BLOCK + within, logit
