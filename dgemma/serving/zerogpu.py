"""Hugging Face ZeroGPU: is this process running on it?

The mode is chosen by the variable ZeroGPU Spaces set (`SPACES_ZERO_GPU`), read the way the
`spaces` package reads it -- never by whether `spaces` imports (it is installed everywhere the
tests run). On ZeroGPU the GPU work runs in `dgemma.serving.gpu_worker.run_on_gpu` in a forked worker and
the main process holds the backend of `dgemma.serving.gpu_backend`; anywhere else nothing changes.
"""

from __future__ import annotations

import os


def enabled() -> bool:
    """True on a ZeroGPU Space (or its simulation in tests/test_zerogpu.py)."""
    return os.environ.get("SPACES_ZERO_GPU", "").lower() in ("1", "t", "true")
