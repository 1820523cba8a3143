"""Calibration and the tile planner: how many requests' sampler step fit in half of free memory."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from dgemma.memory.tracker import measure_peak, raise_out_of_memory


@dataclass(frozen=True)
class Calibration:
    """Transient bytes of one sampler call: `fixed + per_request * n` for a tile of n requests."""

    bytes_per_request: int
    fixed_bytes: int
    canvas_length: int
    vocab_size: int

    @property
    def copies_per_request(self) -> float:
        """How many fp32 [CL, vocab] tensors one request keeps alive at the peak."""
        return self.bytes_per_request / (self.canvas_length * self.vocab_size * 4)

    def tile_bytes(self, n: int) -> int:
        return self.fixed_bytes + self.bytes_per_request * n


def calibrate(prepare: Callable[[int], Callable[[], object]], canvas_length: int, vocab_size: int) -> Calibration:
    """Measure the step's transient at tiles of 1 and 2 requests and fit `fixed + per_request * n`.

    `prepare(n)` builds the inputs of one sampler tile of n requests at the real (CL, vocab,
    hidden) shapes and returns the call to measure, so the inputs are not counted as transient.
    The sampler builds them on meta tensors: even vocab 262,144 costs no memory.
    """
    one = measure_peak(prepare(1))
    two = measure_peak(prepare(2))
    per_request = max(1, two - one)
    return Calibration(per_request, max(0, one - per_request), canvas_length, vocab_size)


def plan_tiles(
    num_decode: int,
    free_bytes: int,
    calibration: Calibration,
    fraction: float = 0.5,
) -> int:
    """Largest group of requests whose step fits `fraction` of free memory; never below 1.

    Raises `torch.OutOfMemoryError` naming bytes needed and free when even one request cannot
    fit in all of free memory: tiling cannot help then, and the caller should say so.
    """
    if num_decode <= 0:
        return 0
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction must be in (0, 1], got {fraction}")
    one = calibration.tile_bytes(1)
    if one > free_bytes:
        raise_out_of_memory(one, free_bytes, "one request's sampler step")
    usable = int(free_bytes * fraction) - calibration.fixed_bytes
    group = usable // calibration.bytes_per_request
    return int(max(1, min(num_decode, group)))


def split_tiles(num_decode: int, group: int, even: bool = False) -> list[tuple[int, int]]:
    """[(start, end), ...] covering 0..num_decode in tiles of `group` (the last may be smaller), or
    with `even` in as many tiles, of sizes that differ by at most one (16 in groups of 7: 6, 5, 5
    rather than 7, 7, 2). Even tiles peak lower, and on a CPU they run faster: each tile's LM
    head and soft embedding are matrix products that read the whole embedding once whatever the
    tile's rows, and a tile of few rows pays that for little work (docs/benchmarks.md)."""
    if not even or num_decode <= group:
        return [(s, min(s + group, num_decode)) for s in range(0, num_decode, group)]
    count = -(-num_decode // group)
    size, larger = divmod(num_decode, count)
    ends = [(i + 1) * size + min(i + 1, larger) for i in range(count)]
    return list(zip([0] + ends[:-1], ends))
