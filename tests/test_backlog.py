"""A visitor who is behind, as dgemma/serving/backlog.py reads it from Gradio's own queue.

A real Gradio server streams large values to a real socket that reads nothing (a link that cannot
keep up): the messages wait in the session's queue, where `backlog.waiting` finds them, and a stream
through `coalesced` leaves at most one there. If a Gradio upgrade moves that queue, these fail.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
import urllib.request

import gradio as gr
import pytest
from gradio.context import LocalContext
from gradio.queueing import Event

from dgemma.serving import backlog
from dgemma.ui.stream import coalesced

VALUES, VALUE_BYTES = 40, 256 * 1024  # 10 MB in all: far more than the socket buffers hold


def test_gradio_keeps_each_sessions_unwritten_messages_in_an_asyncio_queue_by_session_hash():
    demo = gr.Blocks().queue()
    assert isinstance(demo._queue.pending_messages_per_session, dict)
    demo._queue.pending_messages_per_session["s"] = asyncio.Queue()
    demo._queue.pending_messages_per_session["s"].put_nowait("a frame")
    token = LocalContext.blocks.set(demo)
    try:
        assert backlog.waiting("s") == 1 and backlog.Visitor("s").behind() and not backlog.Visitor("another").behind()
    finally:
        LocalContext.blocks.reset(token)


@pytest.fixture
def queued_session():
    """Gradio's queue of a Blocks, current as inside an event, with session "s" holding one unwritten message."""
    demo = gr.Blocks().queue()
    demo._queue.pending_messages_per_session["s"] = messages = asyncio.Queue()
    messages.put_nowait("a frame")
    token = LocalContext.blocks.set(demo)
    yield messages
    LocalContext.blocks.reset(token)


def test_while_behind_only_the_last_update_goes(queued_session):
    assert list(coalesced(range(5), backlog.Visitor("s"), lambda i: i == 4)) == [4]


def test_once_caught_up_every_update_goes(queued_session):
    queued_session.get_nowait()
    assert list(coalesced(range(5), backlog.Visitor("s"), lambda i: i == 4)) == [0, 1, 2, 3, 4]


def test_while_behind_one_update_goes_every_few_seconds_so_a_gone_client_is_noticed(queued_session):
    ticks = iter(range(0, 100, 2))  # each look at the clock is 2 s later
    sent = list(coalesced(range(10), backlog.Visitor("s"), lambda i: i == 9, still_there_s=5, clock=lambda: next(ticks)))
    assert sent == [2, 5, 8, 9]


def test_a_gone_clients_stream_sends_its_next_update_at_once_though_behind(queued_session):
    demo = LocalContext.blocks.get()
    with demo:
        button = gr.Button()
        button.click(lambda: None)
    event = Event("s", demo.fns[0], None, None)  # Gradio's own job for an event of session "s"
    demo._queue.active_jobs = [[event]]
    token = LocalContext.event_id.set(event._id)
    try:
        assert list(coalesced(range(5), backlog.Visitor("s"), lambda i: i == 4)) == [4]  # behind, and there
        event.alive = False  # as Gradio's Queue.clean_events marks it when the client's stream closes
        assert list(coalesced(range(5), backlog.Visitor("s"), lambda i: i == 4)) == [0, 1, 2, 3, 4]
    finally:
        LocalContext.event_id.reset(token)


def test_outside_an_event_no_one_is_behind():
    assert backlog.waiting("s") == 0 and not backlog.Visitor("s").behind()


@pytest.fixture(scope="module")
def server():
    seen: dict[str, list[int]] = {"plain": [], "coalesced": []}

    def values(name: str, request: gr.Request):
        session = request.session_hash
        for i in range(VALUES):
            seen[name].append(backlog.waiting(session))
            yield f"{i} " + "x" * VALUE_BYTES
            time.sleep(0.02)

    def plain(request: gr.Request):
        yield from values("plain", request)

    def skipping(request: gr.Request):
        steps = coalesced(range(VALUES), backlog.Visitor(request.session_hash), lambda i: i == VALUES - 1)
        for i in steps:
            seen["coalesced"].append(backlog.waiting(request.session_hash))
            yield f"{i} " + "x" * VALUE_BYTES
            time.sleep(0.02)

    with gr.Blocks() as demo:
        out = gr.Textbox()
        gr.Button("plain").click(plain, None, out, api_name="plain")
        gr.Button("skipping").click(skipping, None, out, api_name="skipping")
    demo.queue().launch(prevent_thread_lock=True, server_name="127.0.0.1", quiet=True)
    yield demo, seen
    demo.close()


def stalled_stream(url: str, fn_index: int, session: str) -> socket.socket:
    """Join the queue and open the session's event stream on a socket that then reads nothing."""
    body = json.dumps({"data": [], "fn_index": fn_index, "session_hash": session, "event_data": None}).encode()
    urllib.request.urlopen(urllib.request.Request(f"{url}gradio_api/queue/join", body,
                                                  {"Content-Type": "application/json"}), timeout=10).read()
    host, port = url.split("//")[1].rstrip("/").split(":")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect((host, int(port)))
    sock.sendall(f"GET /gradio_api/queue/data?session_hash={session} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
    return sock


def read_to_end(sock: socket.socket) -> bytes:
    sock.settimeout(30)
    data = b""
    while b'"close_stream"' not in data[-4096:]:
        chunk = sock.recv(1 << 20)
        if not chunk:
            break
        data += chunk
    sock.close()
    return data


def fn_index(demo: gr.Blocks, name: str) -> int:
    return next(i for i, fn in demo.fns.items() if fn.api_name == name)


def test_a_stream_to_a_socket_that_reads_nothing_piles_up_in_the_sessions_queue(server):
    demo, seen = server
    sock = stalled_stream(demo.local_url, fn_index(demo, "plain"), "stalled-plain")
    time.sleep(VALUES * 0.05 + 2)  # the generator runs to its end meanwhile
    assert len(seen["plain"]) == VALUES and max(seen["plain"]) >= VALUES // 2, seen["plain"]
    assert b'"0 xxx' in read_to_end(sock)


def test_a_coalesced_stream_leaves_at_most_one_message_waiting_and_sends_the_last(server):
    demo, seen = server
    sock = stalled_stream(demo.local_url, fn_index(demo, "skipping"), "stalled-coalesced")
    time.sleep(VALUES * 0.05 + 2)
    assert 1 <= len(seen["coalesced"]) < VALUES // 2 and max(seen["coalesced"]) <= 2, seen["coalesced"]
    assert f'"{VALUES - 1} xxx'.encode() in read_to_end(sock)  # the last value reaches the visitor
