"""Keyed randomness: every random number a request uses is a function of (seed, canvas, step,
purpose, position, token), never of a shared stream, so tiling, batch-mates and vocab chunks
change no token (docs/design.md, keyed randomness).

One generator: a counter (position, and for the sample's block race the vocab block) hashed with
the splitmix64/murmur3 finalisers in int64 tensor ops, on any device. No draw is as wide as the
vocabulary: a sampled token costs one Gumbel number per `sampling.blocks.BLOCK` vocab entries
and one uniform (docs/design.md, keyed randomness), so the noise is small enough to hash.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

# Purposes of keyed random numbers: a request draws each of these once per (canvas, step), the
# step counting the canvas's decoder forwards (a corrector sweep is one). GUMBEL: the block race's
# noise; PICK: the uniform that picks the token inside the winning block; RENOISE: the tokens of the
# positions not kept (every scheduler's); ROUTE: discrete DDIM's route per position (clean, stay or
# noise); SELECT: a corrector sweep's Gumbel-top-k over positions (or its scores, selection
# "random"); RESAMPLE: the uniform that draws a selected position's new token.
INIT, GUMBEL, RENOISE, PICK, ROUTE, SELECT, RESAMPLE = 1, 2, 3, 4, 5, 6, 7

_U64 = 1 << 64


def _signed(x: int) -> int:
    """A 64-bit pattern as torch's int64 (whose multiply wraps like uint64)."""
    x &= _U64 - 1
    return x - _U64 if x >= 1 << 63 else x


_GOLDEN = _signed(0x9E3779B97F4A7C15)
_FMIX1 = _signed(0xFF51AFD7ED558CCD)
_FMIX2 = _signed(0xC4CEB9FE1A85EC53)


def _mix64(x: int) -> int:
    """splitmix64 finaliser on Python ints: spreads nearby keys over the 64-bit space."""
    x = (x + 0x9E3779B97F4A7C15) & (_U64 - 1)
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & (_U64 - 1)
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & (_U64 - 1)
    return x ^ (x >> 31)


def stream_key(seed: int, canvas_index: int, step: int, purpose: int) -> int:
    """The key of one request's random numbers for one (canvas, step, purpose), as int64."""
    key = _mix64(seed)
    for part in (canvas_index, step, purpose):
        key = _mix64(key ^ part)
    return _signed(key)


@dataclass(frozen=True)
class RowKey:
    """Who a tile row is, for its random numbers: the request's seed, canvas and step (forwards
    done on the canvas), whether it samples at all (a greedy row draws no Gumbel noise), its
    scheduler, whether this forward is a corrector sweep (discrete DDIM) and whether its scheduler
    reads the raw distribution (`DenoisingScheduler.reads_raw`): together, the row's kind."""

    seed: int
    canvas_index: int
    step: int
    greedy: bool = False
    scheduler: str = "entropy_bound"
    sweep: bool = False
    raw: bool = False  # block refinement's and DDIM's rows: temperature 1, and a plan (sampling/schedulers/)

    @property
    def greedy_pass(self) -> bool:
        """Whether the row's softmax is a greedy row's (no race in it): the entropy bound's greedy
        rows, and those that read the raw distribution (a temperature's sample is a pass of its own)."""
        return self.greedy or self.raw

    @property
    def tempered(self) -> bool:
        """A raw-reading predictor row that samples at a temperature (its own pass)."""
        return not self.greedy and self.raw and not self.sweep

    @property
    def kind(self) -> tuple[str, bool, bool]:
        """What decides the row's work in a tile (and so what a tile of such rows allocates)."""
        return self.scheduler, self.greedy, self.sweep

    def key(self, purpose: int) -> int:
        return stream_key(self.seed, self.canvas_index, self.step, purpose)


def row_keys(rows: Sequence[RowKey], purpose: int, device: torch.device) -> torch.Tensor:
    """[n] int64 keys, one per row (built on the host: no device reads)."""
    keys = [r.key(purpose) for r in rows]
    return torch.tensor(keys, dtype=torch.long).to(device, non_blocking=True)


def _shift_right(z: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical right shift of int64 (torch's >> is arithmetic)."""
    return (z >> bits) & ((1 << (64 - bits)) - 1)


def _fmix64(z: torch.Tensor) -> torch.Tensor:
    """murmur3's 64-bit finaliser, in place."""
    z ^= _shift_right(z, 33)
    z *= _FMIX1
    z ^= _shift_right(z, 33)
    z *= _FMIX2
    z ^= _shift_right(z, 33)
    return z


def _counters(keys: torch.Tensor, canvas_length: int) -> torch.Tensor:
    """[n, CL] int64: a distinct 64-bit counter per (key, position), before mixing."""
    positions = torch.arange(canvas_length, device=keys.device) * _GOLDEN
    return (keys + _GOLDEN).view(-1, 1) + positions.view(1, -1)


def keyed_tokens(keys: torch.Tensor, canvas_length: int, vocab_size: int) -> torch.Tensor:
    """Uniform random token ids [n, CL] (uniform up to a bias of vocab / 2^63)."""
    return _shift_right(_fmix64(_counters(keys, canvas_length)), 1) % vocab_size


def _unit(z: torch.Tensor) -> torch.Tensor:
    """The top 24 bits of mixed int64 `z` as float32 uniforms in [0, 1) (exact: 24-bit integers)."""
    return _shift_right(_fmix64(z), 40).float().mul_(2.0**-24)


def keyed_uniform(keys: torch.Tensor, canvas_length: int) -> torch.Tensor:
    """Uniform floats [n, CL] in [0, 1), one per (key, position)."""
    return _unit(_counters(keys, canvas_length))


def keyed_block_gumbel(keys: torch.Tensor, canvas_length: int, first_block: int, num_blocks: int) -> torch.Tensor:
    """Standard Gumbel noise [n, CL, num_blocks] for vocab blocks first_block..: entry (i, p, b)
    depends only on (keys[i], p, first_block + b), so any range of blocks gets the same slice of
    the whole draw. Gumbel = -log(-log u) with u in [0, 1): u = 0 gives -inf (never wins)."""
    blocks = torch.arange(first_block, first_block + num_blocks, device=keys.device) * _signed(_GOLDEN << 20)
    z = _counters(keys, canvas_length)[..., None] + blocks
    return _unit(z).log_().neg_().log_().neg_()


def keyed_categorical(weights: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """The inverse-CDF draw [...] from unnormalised `weights` [..., k] with `uniform` [...] in
    [0, 1): the first entry whose cumulative weight passes u x the total (never one of weight 0
    but by rounding at the very top, where the last entry is taken)."""
    cumulative = weights.cumsum(dim=-1)
    target = uniform.to(cumulative.dtype)[..., None] * cumulative[..., -1:]
    return (cumulative[..., :-1] <= target).sum(dim=-1)
