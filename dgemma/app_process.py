"""Run `python app.py` as a real server process on 127.0.0.1 and wait until it answers.

Used by the load benchmark and the app's tests: the server is a subprocess, started as a user
starts it, so its start-up time is measured and its log kept for when something fails.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGE_LINE = "dgemma page at"  # app.py prints it once the server answers (the model may still be loading)
READY_LINE = "dgemma app ready at"  # app.py prints it once the model answers too


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


def launch(args: list[str], log_path: Path, timeout: float = 90.0, env: dict[str, str] | None = None,
           ready_line: str = READY_LINE, python: str = sys.executable) -> AppServer:
    """Start the app (under `python`) on a free port and wait for `ready_line` (the model answers;
    PAGE_LINE: the page does); raise with the log if it dies or times out. `env` adds to the environment."""
    port = free_port()
    env = {**os.environ, "GRADIO_ANALYTICS_ENABLED": "False", "NO_PROXY": "127.0.0.1,localhost", **(env or {})}
    started = time.monotonic()
    with open(log_path, "w") as log:
        process = subprocess.Popen([python, str(ROOT / "app.py"), "--host", "127.0.0.1", "--port", str(port), *args],
                                   cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    server = AppServer(f"http://127.0.0.1:{port}", process, log_path, 0.0)
    while time.monotonic() - started < timeout:
        if process.poll() is not None:
            raise RuntimeError(f"app.py exited with {process.returncode}:\n{server.log()}")
        if ready_line in server.log():
            server.startup_s = time.monotonic() - started
            return server
        time.sleep(0.1)
    server.stop()
    raise RuntimeError(f"app.py was not ready within {timeout} s:\n{server.log()}")
