"""`python -m dgemma.bench sampler|engine|load|soak|recording|hostile|frames|lesson|decoder|page`: measured claims, each side by side with a baseline."""

from __future__ import annotations

import importlib
import json
import math
import sys
import time
from collections.abc import Callable
from typing import TypeVar

BENCHES = {
    "sampler": "dgemma.bench.sampler",  # the step's transient memory and time, untiled vs tiled
    "engine": "dgemma.bench.engine",  # engine throughput vs transformers' generate()
    "load": "dgemma.bench.load",  # the app under many concurrent clients
    "soak": "dgemma.bench.soak",  # the app under steady traffic for minutes: errors, latency, RSS growth
    "recording": "dgemma.bench.recording",  # a run's recording at its bound vs keeping the events
    "hostile": "dgemma.bench.hostile",  # disk and memory under oversized uploads, tabs, recorded API calls
    "frames": "dgemma.bench.frames",  # one live-view frame: cards as HTML vs compact data; seeking a run
    "lesson": "dgemma.bench.lesson",  # the lesson's run tiled under its budget vs untiled with room
    "decoder": "dgemma.bench.decoder",  # the decoder's step: experts per canvas vs whole batch vs the eager loop
    "page": "dgemma.bench.page",  # a loaded server's fresh page until Run is enabled vs a bare Gradio app's
}


def percentile(values: list[float], q: float) -> float:
    """The nearest-rank `q` quantile (0 < q <= 1) of `values`: an observed value, never an interpolation."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def bench_prompts(n: int) -> list[str]:
    """`n` held-out prompts of every task family, interleaved (mixed lengths and answer lengths; deterministic)."""
    from dgemma.embedded import corpus

    pools = [corpus.heldout(family) for family in corpus.FAMILIES]
    return [pools[i % len(pools)][i // len(pools) % corpus.HELDOUT_POOL].prompt for i in range(n)]


T = TypeVar("T")


def timed(call: Callable[..., T], *args) -> tuple[T, float]:
    """What `call(*args)` returns and the wall-clock seconds it took."""
    started = time.perf_counter()
    value = call(*args)
    return value, time.perf_counter() - started


def sync(device) -> None:
    """Wait for `device`'s queued work (a CUDA device's; a CPU's is done when its call returns), so a clock reads it."""
    if device.type == "cuda":
        import torch

        torch.cuda.synchronize(device)


def print_row(row: dict, as_json: bool, width: int = 32, end: str = "") -> None:
    """A bench's result, flushed: one JSON line, or `name: value` lines (names right-aligned to `width`, then `end`)."""
    print(json.dumps(row) if as_json else "\n".join(f"{k:>{width}}: {v}" for k, v in row.items()) + end, flush=True)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in BENCHES:
        given = argv[0] if argv else "nothing"
        raise ValueError(f"choose a benchmark: {' | '.join(BENCHES)} (got {given})")
    module = importlib.import_module(BENCHES[argv[0]])
    return module.main(argv[1:])

