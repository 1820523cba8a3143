"""A CPU's matrix products, asked to give a row the same bits whatever the rows beside it.

torch hands a CPU's fp32 products to MKL's sgemm, which picks its kernel and its split of the
work between threads by the product's shape. With few rows and a long sum, it splits the sum
between the threads and adds their parts, so a row of `W @ E` came out with other last bits in
a product of a few rows than in one of many: a request's self-conditioning embedding (its
weights [CL, vocab] @ the embedding [vocab, hidden]) depended on how many requests shared its
tile, and the LM head's logits did too in a tile of under 16 positions. Measured on this
project's 2-core Xeon (AVX-512, torch 2.13.0, MKL 2024.2): with two threads, rows 1-12 of
[rows, 2000] @ [2000, 8] and 1-15 of [rows, 32768] @ [32768, 640] differed from the same rows in
a product of 128; a single row differed at one thread too, and on MKL's AVX2 path (as on a CPU
without AVX-512) about two row counts in three did, at one thread as at two.

MKL's strict conditional-numerical-reproducibility mode (`MKL_CBWR=AUTO,STRICT`) sums every
element in one fixed order: each of those shapes then gave the same bits at every row count
from 1 to 128, on both code paths, at one and two threads, and the LM head's shapes too. MKL
reads the variable once, at its first call, so the package sets it when it is imported (before
any product; importing torch calls no MKL). A process that ran an MKL product before importing
dgemma keeps MKL's default mode.

MKL honours STRICT on Intel CPUs only (its docs: other CPUs have only its AUTO and COMPATIBLE
branches, neither strict); `mkl_strict_mode_holds()` checks whether it is in force. Without it,
the AUTO branch this module still asks for took another kernel for a product of one to three rows
on an AMD EPYC, and kept every row count from four on (docs/benchmarks.md, "Where MKL cannot be
strict"). A request brings at least a canvas of rows (CL >= 4) to each of the sampler's products,
and experts run per canvas on a CPU, so its tokens hold there too; experts over the whole batch
(an expert routed one to three of a batch's tokens) do not, and are not the CPU's default.

Out of its reach: a CPU's bf16/fp16 products (oneDNN, which gave other bits for some row counts
at one thread), and a GPU's (cuBLAS, which picks its kernels by shape too; the one H200 run
compared tiles' tokens, all equal, not their soft embeddings: scripts/gpu_check.py now compares
those, in tiles of one request). So no step computes its products per request: that would cost a
GPU a launch per request, and a CPU re-packing the embedding per request (1.3-3.4x the one
product's CPU time at 16-32 positions per request, hand timed), for bits that are already equal on
a CPU (in strict mode, or at a canvas of rows a request).
"""

from __future__ import annotations

import os

STRICT = "STRICT"


def ask_mkl_for_strict_reproducibility() -> str:
    """Set `MKL_CBWR` to MKL's fastest code path in strict mode (`AUTO,STRICT`), or add STRICT to
    the branch a user set; returns the value. STRICT holds only on an AVX2 or later branch."""
    value = os.environ.get("MKL_CBWR", "").replace(" ", "")
    if STRICT not in value.upper().split(","):
        os.environ["MKL_CBWR"] = f"{value},{STRICT}" if value else f"AUTO,{STRICT}"
    return os.environ["MKL_CBWR"]


def mkl_strict_mode_holds() -> bool:
    """Whether this process's CPU products are in MKL's strict mode: a row of a product of one to three
    rows (the rows MKL takes another kernel for elsewhere) has the bits it has among 64. Checked, not
    read off the CPU's name: a process that ran a product before importing dgemma is not strict on
    an Intel CPU either. About a millisecond."""
    import torch  # only here: importing dgemma stays free of torch

    gen = torch.Generator().manual_seed(0)
    weights, matrix = torch.rand(64, 256, generator=gen), torch.randn(256, 64, generator=gen)
    whole = weights @ matrix
    return all(torch.equal(weights[:rows] @ matrix, whole[:rows]) for rows in (1, 2, 3))
