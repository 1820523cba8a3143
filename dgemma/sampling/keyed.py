"""Keyed randomness: every random number a request uses is a function of (seed, canvas, step,
purpose, position, token), never of a shared stream, so tiling, batch-mates and vocab chunks
change no token (docs/design.md, keyed randomness).

Two generators, each the cheapest for its size:
- small draws ([n, CL]: a canvas's initial tokens, re-noised tokens) hash a counter with
  splitmix64/murmur3 finalisers in int64 tensor ops;
- the Gumbel noise over [n, CL, vocab] comes in noise blocks of `NOISE_BLOCK` vocab entries, one
  torch generator stream per (request key, block): mt19937 on a CPU, Philox on CUDA, one bulk
  draw per block. A vocab slice that cuts a block draws the whole block and keeps its slice.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

# Purposes of keyed random numbers: a request draws each of these once per (canvas, step).
INIT, GUMBEL, RENOISE = 1, 2, 3

NOISE_BLOCK = 8192  # vocab entries per noise stream (= the chunked step's widest chunk)

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
    """Who a tile row is, for its random numbers: the request's seed, canvas and step, and
    whether it samples at all (a greedy row draws no Gumbel noise)."""

    seed: int
    canvas_index: int
    step: int
    greedy: bool = False

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


def keyed_tokens(keys: torch.Tensor, canvas_length: int, vocab_size: int) -> torch.Tensor:
    """Uniform random token ids [n, CL] (uniform up to a bias of vocab / 2^63)."""
    positions = torch.arange(canvas_length, device=keys.device) * _GOLDEN
    z = (keys + _GOLDEN).view(-1, 1) + positions.view(1, -1)
    return _shift_right(_fmix64(z), 1) % vocab_size


_generators: dict[torch.device, torch.Generator] = {}  # one per device, reseeded for every block


def _generator(device: torch.device) -> torch.Generator:
    if device not in _generators:
        _generators[device] = torch.Generator(device=device)
    return _generators[device]


def gumbel_noise(keys: Sequence[int], canvas_length: int, vocab_size: int, start: int, stop: int, device: torch.device) -> torch.Tensor:
    """Gumbel(0, 1) noise [len(keys), CL, stop - start] float32 for vocab entries [start, stop).

    Entry (i, p, v) depends only on (keys[i], p, v): block b = v // NOISE_BLOCK is one generator
    stream seeded from (keys[i], b), drawn in [CL, block width] order, so any slice equals the
    same slice of the whole draw. -log(-log u) with u in [0, 1): u = 0 gives -inf (never wins).
    """
    noise = torch.empty(len(keys), canvas_length, stop - start, device=device)
    if device.type != "meta":  # meta: shapes only (calibration), nothing to draw
        gen = _generator(device)
        for i, key in enumerate(keys):
            for block in range(start // NOISE_BLOCK, -(-stop // NOISE_BLOCK)):
                lo, hi = block * NOISE_BLOCK, min((block + 1) * NOISE_BLOCK, vocab_size)
                a, b = max(lo, start), min(hi, stop)
                gen.manual_seed(_mix64(key ^ block))
                if (a, b) == (lo, hi):
                    noise[i, :, a - start : b - start].uniform_(generator=gen)
                else:  # the slice cuts this block: draw all of it, keep the slice
                    whole = torch.empty(canvas_length, hi - lo, device=device).uniform_(generator=gen)
                    noise[i, :, a - start : b - start] = whole[:, a - lo : b - lo]
    return noise.log_().neg_().log_().neg_()
