"""A launched `python app.py` shared by the app's tests (conftest's `app_server` fixture).

The launching itself is `dgemma.app_process.launch`, the same the load benchmark uses: a real server
subprocess on 127.0.0.1 and a free port, its start-up measured, its log kept for failures.
"""

from __future__ import annotations

import atexit
import os
from pathlib import Path

from dgemma.app_process import ROOT, AppServer, launch

__all__ = ["MODEL_ARGS", "ROOT", "AppServer", "launch", "shared"]

# The embedded model, as `python app.py` uses it with no flags. DGEMMA_TEST_MODEL points the app
# tests (server and CLI alike) at another checkpoint, e.g. before assets/model is trained.
MODEL = os.environ.get("DGEMMA_TEST_MODEL")
MODEL_ARGS = ["--model", MODEL] if MODEL else []

_SHARED: dict[tuple[str, ...], AppServer] = {}


def shared(args: list[str], log_dir: Path) -> AppServer:
    """One server per argument list for the whole test session (the API and browser tests share it)."""
    key = tuple(args)
    server = _SHARED.get(key)
    if server is None or server.process.poll() is not None:
        server = _SHARED[key] = launch(args, log_dir / f"app-{len(_SHARED)}.log")
        atexit.register(server.stop)
    return server
