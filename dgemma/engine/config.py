"""The engine's settings and its one start-up error."""

from __future__ import annotations

from dataclasses import dataclass


class EngineError(RuntimeError):
    """The engine cannot start (e.g. the memory budget is smaller than the weights)."""


@dataclass(frozen=True)
class EngineConfig:
    max_num_seqs: int = 8  # requests denoising at once (slots)
    tiling: str | int = "auto"  # default RunOptions.tiling: auto | off | N requests per tile
    sampler: str = "reference"  # default RunOptions.sampler: reference (eager, the lesson's) | chunked
    memory_budget: int | None = None  # bytes: on a CPU a virtual device; on CUDA a per-process cap
    max_waiting: int = 10_000  # requests queued in total, beyond which submit refuses
    max_new_tokens: int = 4096  # the most one request may ask for
    max_prompt_chars: int = 1_000_000  # longer prompts are refused before tokenizing
    auto_restart: bool = True  # a dead engine thread restarts itself (running requests fail)
    max_restarts: int = 5  # ... at most this many times in a row without a successful step
