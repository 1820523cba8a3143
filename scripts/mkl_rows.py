"""Which row counts of a CPU's fp32 product give a row other bits than in a product of 256 rows.

    python scripts/mkl_rows.py THREADS                      # in MKL's mode as the environment sets it
    MKL_CBWR=AUTO,STRICT python scripts/mkl_rows.py 2       # the mode dgemma asks for on import

For each shape, rows [:r] of W[256, width] @ E[width, hidden] against the same rows of the 256-row
product, r from 1 to 255: how many row counts differed, then the first twelve. It does not import
dgemma (which would set MKL_CBWR), so the environment's mode is the one measured. The table of
docs/benchmarks.md, "Where MKL cannot be strict", is its output for four modes at one and two threads.
"""

from __future__ import annotations

import os
import sys

import torch

SHAPES = [(2000, 8), (32768, 256), (256, 32768), (32768, 640), (4096, 512), (64, 64)]


def differing_rows(width: int, hidden: int, rows: int = 256) -> list[int]:
    gen = torch.Generator().manual_seed(3)
    weights, matrix = torch.rand(rows, width, generator=gen), torch.randn(width, hidden, generator=gen)
    whole = weights @ matrix
    return [r for r in range(1, rows) if not torch.equal(weights[:r] @ matrix, whole[:r])]


def main() -> None:
    torch.set_num_threads(int(sys.argv[1]) if len(sys.argv) > 1 else torch.get_num_threads())
    out = []
    for width, hidden in SHAPES:
        rows = differing_rows(width, hidden)
        out.append(f"[{width}x{hidden}]: {len(rows)} {rows[:12]}")
    print(f"MKL_CBWR={os.environ.get('MKL_CBWR', 'unset'):<12} threads={torch.get_num_threads()} ", " | ".join(out),
          flush=True)


if __name__ == "__main__":
    main()
