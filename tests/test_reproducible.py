"""A CPU's matrix products give a row the same bits whatever the rows beside it (dgemma/reproducible.py)."""

from __future__ import annotations

import os

import pytest
import torch

from dgemma.reproducible import ask_mkl_for_strict_reproducibility, mkl_strict_mode_holds

# MKL is strict on Intel CPUs only; elsewhere (an AMD EPYC, docs/benchmarks.md) a product of one to
# three rows took another kernel, and from four rows on every row count gave the same bits.
FEWEST_ROWS = 1 if mkl_strict_mode_holds() else 4


@pytest.mark.parametrize(
    "rows_by_width", [(2000, 8), (32768, 256), (256, 32768)], ids=["soft-embedding-tiny", "soft-embedding", "lm-head"]
)
def test_a_row_of_a_product_has_the_same_bits_whatever_the_row_count(rows_by_width, threads):
    # Without MKL's strict mode, on an Intel Xeon at two threads, rows 1-12 of the first shape and
    # 1-10 of the LM head's differed from the same rows in a product of 64.
    width, hidden = rows_by_width
    gen = torch.Generator().manual_seed(3)
    weights, matrix = torch.rand(64, width, generator=gen), torch.randn(width, hidden, generator=gen)
    whole = weights @ matrix
    for rows in range(FEWEST_ROWS, 64):
        assert torch.equal(weights[:rows] @ matrix, whole[:rows]), f"{rows} rows"


def test_mkl_is_asked_for_its_fastest_path_in_strict_mode(monkeypatch):
    monkeypatch.delenv("MKL_CBWR", raising=False)
    assert ask_mkl_for_strict_reproducibility() == "AUTO,STRICT"


def test_a_branch_the_user_chose_is_kept_and_made_strict(monkeypatch):
    monkeypatch.setenv("MKL_CBWR", "AVX2")
    assert ask_mkl_for_strict_reproducibility() == "AVX2,STRICT"


def test_a_strict_setting_is_left_as_it_is(monkeypatch):
    monkeypatch.setenv("MKL_CBWR", "avx512, strict")
    ask_mkl_for_strict_reproducibility()
    assert os.environ["MKL_CBWR"] == "avx512, strict"
