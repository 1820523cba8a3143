"""A client that vanishes mid-stream: a real gradio_client process, killed with SIGKILL.

Shared by the app's tests (tests/test_app_api.py) and the ZeroGPU simulation
(tests/test_zerogpu.py): the process streams the Run button's endpoint, prints each frame it
receives, and is killed after a few of them, so the system closes its connections as it would
for any crashed program. `wait_until` is every such test's wait: a condition polled under a bound.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable

from dgemma.ui.generate_tab.controls import client_inputs

# Run-button inputs for a run that would last minutes: 16 requests of 256 tokens (16 canvases on the
# embedded model), each canvas taking all 512 steps (a confidence threshold nothing reaches).
# The Run button's inputs in their order (dgemma/ui/generate_tab/controls.py's FIELDS).
LONG_RUN = tuple(client_inputs("count 1 to 12\nreverse hello", 16, max_new_tokens=256, max_denoising_steps=512,
                               confidence_threshold=1e-9, stability_threshold=8))
# A client whose process dies is noticed at the latest at the server's next frame to it, 0.5 s away
# on an idle machine (a stream hands Gradio a frame every 0.5 s); the tests allow ten times that, so
# a busy machine cannot fail them. The seconds it takes are printed by the tests, not bounded tight.
BOUND_S = 5.0


def wait_until(condition: Callable[[], bool], bound_s: float, period_s: float = 0.02) -> float | None:
    """The time.monotonic() at which `condition()` was first seen to hold, polled every `period_s`;
    None if it did not hold within `bound_s` seconds.

    The suite's one sleep: what it waits on is another process (a server's log, a worker, a file a
    process writes) or a thread another thread started (the engine's restarts), outside the test's
    control and with nothing to join or await; `bound_s` is a ceiling,
    never the expected time, so a loaded machine only waits longer."""
    started = time.monotonic()
    while True:
        if condition():
            return time.monotonic()
        if time.monotonic() - started > bound_s:
            return None
        time.sleep(period_s)  # polling another process: see above


def stream_then_kill(url: str, inputs: tuple = LONG_RUN, frames: int = 3, timeout_s: float = 180.0,
                     heartbeat: bool = True) -> float:
    """Start a client process streaming `inputs`, SIGKILL it after `frames` frames; the kill's time.monotonic().

    heartbeat=False: the client never opens Gradio's heartbeat connection (whose close fires the
    page's unload hook), so only the close of the stream itself can tell the server it has gone."""
    script = (
        "import sys\nfrom gradio_client import Client\n"
        + ("" if heartbeat else "Client._stream_heartbeat = staticmethod(lambda *args: None)\n") +
        f"job = Client({url!r}, verbose=False).submit(*{inputs!r}, api_name='/generate_stream')\n"
        "for i, frame in enumerate(job):\n"
        "    print('frame', i, flush=True)\n"
        "print('ended', frame[-1], flush=True)\n"
    )
    client = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + timeout_s
        for line in client.stdout:
            if line.startswith(f"frame {frames - 1}"):
                break
            assert not line.startswith("ended"), f"the run ended before the client could be killed: {line}"
            assert time.monotonic() < deadline, f"no {frames} frames within {timeout_s} s"
        else:
            raise AssertionError(f"the client exited with {client.wait()} before {frames} frames")
        client.kill()  # SIGKILL: no goodbye, the kernel closes its sockets
        killed = time.monotonic()
        client.wait(timeout=30)
        return killed
    finally:
        if client.poll() is None:
            client.kill()
            client.wait(timeout=30)
