"""Launch `python app.py` as a real server on 127.0.0.1 and a free port, for the app's tests.

Used by test_app_api.py (gradio_client) and test_browser.py (Playwright). The server is a
subprocess, as a user runs it: its startup time is measured, and its log is kept for failures.
"""

from __future__ import annotations

import atexit
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# The embedded model, as `python app.py` uses it with no flags. DGEMMA_TEST_MODEL points the app
# tests (server and CLI alike) at another checkpoint, e.g. before assets/model is trained.
MODEL = os.environ.get("DGEMMA_TEST_MODEL")
MODEL_ARGS = ["--model", MODEL] if MODEL else []


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class AppServer:
    url: str
    process: subprocess.Popen
    log_path: Path
    startup_s: float

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)


def launch(args: list[str], log_path: Path, timeout: float = 60.0) -> AppServer:
    """Start the app and wait for its ready line; raise with the log if it dies or times out."""
    port = free_port()
    env = {**os.environ, "GRADIO_ANALYTICS_ENABLED": "False", "NO_PROXY": "127.0.0.1,localhost"}
    started = time.monotonic()
    with open(log_path, "w") as log:
        process = subprocess.Popen(
            [sys.executable, str(ROOT / "app.py"), "--port", str(port), *args],
            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
        )
    server = AppServer(f"http://127.0.0.1:{port}", process, log_path, 0.0)
    while time.monotonic() - started < timeout:
        if process.poll() is not None:
            raise RuntimeError(f"app.py exited with {process.returncode}:\n{server.log()}")
        if "dgemma app ready at" in server.log():
            server.startup_s = time.monotonic() - started
            return server
        time.sleep(0.1)
    server.stop()
    raise RuntimeError(f"app.py was not ready within {timeout} s:\n{server.log()}")


_SHARED: dict[tuple[str, ...], AppServer] = {}


def shared(args: list[str], log_dir: Path) -> AppServer:
    """One server per argument list for the whole test session (the API and browser tests share it)."""
    key = tuple(args)
    server = _SHARED.get(key)
    if server is None or server.process.poll() is not None:
        server = _SHARED[key] = launch(args, log_dir / f"app-{len(_SHARED)}.log")
        atexit.register(server.stop)
    return server
