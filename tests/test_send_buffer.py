"""An event stream's socket keeps little unsent (dgemma/serving/send_buffer.py): real loopback sockets."""

from __future__ import annotations

import socket

from dgemma.serving.send_buffer import SEND_BUFFER, cap_send_buffer


def unsent_until_blocked(sock: socket.socket) -> int:
    """Bytes the kernel takes from `sock`'s writer while the other end reads nothing."""
    sock.setblocking(False)
    taken = 0
    try:
        while True:
            taken += sock.send(b"x" * 65536)
    except BlockingIOError:
        return taken


def connected() -> tuple[socket.socket, socket.socket, socket.socket]:
    listener = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(listener.getsockname())
    server, _ = listener.accept()
    return listener, client, server


def test_the_connection_of_a_scope_is_found_and_its_send_buffer_fixed():
    listener, client, server = connected()
    with listener, client, server:
        assert cap_send_buffer({"type": "http", "server": server.getsockname(), "client": server.getpeername()})
        assert server.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) == 2 * SEND_BUFFER  # Linux doubles it
        # What the kernel holds for a reader who reads nothing: the send buffer and the reader's receive buffer.
        assert unsent_until_blocked(server) <= 2 * SEND_BUFFER + client.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)


def test_a_scope_with_no_such_connection_changes_nothing():
    listener, client, server = connected()
    with listener, client, server:
        before = server.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)
        assert not cap_send_buffer({"type": "http", "server": server.getsockname(), "client": ("127.0.0.1", 1)})
        assert not cap_send_buffer({"type": "http"})
        assert server.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) == before
