"""A CPU's matrix products, asked to give a row the same bits whatever the rows beside it (docs/design.md).

torch hands a CPU's fp32 products to MKL's sgemm, which picks its kernel and its split of the work between
threads by the product's shape: with few rows and a long sum it splits the sum between the threads, so a
request's self-conditioning embedding and LM-head logits had other last bits in a tile of a few requests than
in one of many. Measured on this project's 2-core Xeon (AVX-512, torch 2.13.0, MKL 2024.2): rows 1-12 of
[rows, 2000] @ [2000, 8] and 1-15 of [rows, 32768] @ [32768, 640] differed from the same rows of a product of
128 at two threads; a single row at one thread too, and about two row counts in three on MKL's AVX2 path.

MKL's strict mode (`MKL_CBWR=AUTO,STRICT`) sums every element in one fixed order: those shapes then kept their
bits at every row count from 1 to 128, on both paths, at one and two threads. MKL reads the variable once, at
its first call, so the package sets it on import (importing torch calls no MKL); a process that ran an MKL
product before importing dgemma keeps the default mode. STRICT holds on Intel CPUs only
(`mkl_strict_mode_holds()` checks): on an AMD EPYC the AUTO branch still kept every row count from four on
(docs/benchmarks.md, "Where MKL cannot be strict"), and a request brings at least a canvas of rows (CL >= 4);
experts over the whole batch do not hold there, and are not the CPU's default.

Out of its reach: a CPU's bf16/fp16 products (oneDNN) and a GPU's (cuBLAS, which picks kernels by shape too;
scripts/gpu_check.py compares tiles' soft embeddings). Computing products per request instead would cost a GPU
a launch per request and a CPU 1.3-3.4x the one product's time (re-packing the embedding), for bits already equal.
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
