"""scripts/gpu_check.py: ready for a GPU, harmless without one."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.server  # runs scripts/gpu_check.py

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: the script would measure it")
def test_gpu_check_without_cuda_prints_one_line_saying_so_and_exits_0():
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_check.py")], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    (line,) = done.stdout.strip().splitlines()
    assert json.loads(line) == {"measure": "skipped",
                                "reason": "no CUDA device on this machine: nothing to measure (run it on a GPU)"}
