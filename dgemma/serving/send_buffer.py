"""A page's event stream keeps little unsent in the kernel, so a slow link holds up its writer soon.

Linux grows a TCP socket's send buffer by itself, up to `net.ipv4.tcp_wmem`'s maximum (4 MiB by
default): to a visitor whose link cannot keep up, the server could push 4 MiB of frames into the
kernel, five minutes at 0.1 Mbit/s, before uvicorn's flow control held up Gradio's writer and a
frame waited in Gradio's queue, which is where dgemma/serving/backlog.py sees that the visitor is
behind. `cap_send_buffer` fixes the event stream's own socket's buffer at `SEND_BUFFER` (the
kernel doubles it for its bookkeeping), which still carries a real-scale frame (30-40 KB) at
once and 10 Mbit/s at 100 ms round trip; every other response keeps the kernel's tuning.

ASGI gives the app no socket, so it is found among this process's file descriptors by its two
addresses (`scope["server"]`, `scope["client"]`). Behind a proxy that rewrites the client's
address, or where /proc is not there, none is found and nothing changes.
"""

from __future__ import annotations

import contextlib
import os
import socket
import stat

# DGEMMA_SEND_BUFFER=0 leaves every socket to the kernel's tuning: the baseline of scripts/measure_slow_visitor.py.
SEND_BUFFER = int(os.environ.get("DGEMMA_SEND_BUFFER", "65536"))  # 64 KiB


def _socket(server: tuple, client: tuple) -> socket.socket | None:
    """A duplicate of the connected TCP socket between `server` and `client` (closing it leaves the original)."""
    try:
        fds = os.listdir("/proc/self/fd")
    except OSError:
        return None
    for name in fds:
        with contextlib.suppress(OSError, ValueError):
            fd = int(name)
            if not stat.S_ISSOCK(os.fstat(fd).st_mode):
                continue
            sock = socket.socket(fileno=os.dup(fd))
            if sock.type == socket.SOCK_STREAM and sock.getsockname()[:2] == server and sock.getpeername()[:2] == client:
                return sock
            sock.close()
    return None


def cap_send_buffer(scope: dict, size: int = SEND_BUFFER) -> bool:
    """Fix the send buffer of the connection `scope` (an ASGI HTTP scope) came on; whether it was found."""
    server, client = scope.get("server"), scope.get("client")
    if not server or not client or size <= 0:
        return False
    sock = _socket(tuple(server), tuple(client))
    if sock is None:
        return False
    with sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, size)
    return True
