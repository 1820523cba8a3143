"""What the tests that compare runs bit for bit share: seeded logits, frames equal, tokens up to the
end of text, and an engine core stepped to the end by the caller."""

from __future__ import annotations

import torch

from dgemma.engine import EngineCore


def logits_for(n: int, canvas_length: int, vocab: int, seed: int, scale: float = 3.0) -> torch.Tensor:
    """Logits [n, CL, vocab] drawn from `seed` alone (one row of them: the same numbers as [CL, vocab])."""
    return torch.randn(n, canvas_length, vocab, generator=torch.Generator().manual_seed(seed)) * scale


def assert_same(a: list[dict], b: list[dict], rows: list[int] | None = None, keys: tuple[str, ...] | None = None) -> None:
    """Two runs equal frame by frame, bit for bit: each frame's tensors (`keys`, else all), of `a`'s
    `rows` only when given (a row of a crowd against the run of it alone)."""
    for k, (one, other) in enumerate(zip(a, b, strict=True)):
        for key in keys or one:
            mine = one[key] if rows is None else one[key][rows]
            assert torch.equal(mine, other[key]), (k, key)


def until_eos(tokens: list[int], eos: int) -> list[int]:
    return tokens[: tokens.index(eos)] if eos in tokens else tokens


def drive(core: EngineCore, max_steps: int = 10_000) -> int:
    """Step `core` until nothing is unfinished; the steps it took."""
    steps = 0
    while core.has_unfinished():
        core.step()
        steps += 1
        assert steps < max_steps, "the core did not finish"
    return steps
