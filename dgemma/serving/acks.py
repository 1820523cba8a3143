"""Which frames a page has drawn: the page says so, and its stream sends the next frame only then.

On a slow link the frames a stream sends wait in the sockets and the link's own buffers (0.5-0.7 MB
through chromium's emulated 0.1 Mbit/s) long before Gradio's queue holds one (dgemma/serving/
backlog.py): the visitor sees what was sent half a minute ago. So a stream stamps each frame it
sends with its token (random, made per stream) and a sequence number (`Acks.sent`); the page's
script (assets/board_view.js), once it has drawn the frame, posts "TOKEN SEQ" to ACK_PATH; and
while a frame it sent is not yet drawn, the stream is behind (`in_flight`) and skips frames,
coalescing to the latest. That holds from a stream's first frame: waiting for the page to say it
draws at all would let the link's buffers fill first. A stream whose first frame is not drawn
within FIRST_ACK_S (an API client, a view without the script, a link slower than that) is not held
back by it again until its page says it drew one. A page that draws a frame within
QUICK_ROUND_TRIP_S of its sending (a fast link) may have two in flight (`holding`): the next one
travels while it draws, as it did before, and the lag that adds is under that round trip.

The route is public: `AckRoute` answers every POST to ACK_PATH with 204, whatever it holds (an
unknown token is ignored, and says nothing), reads at most MAX_BODY bytes and refuses a longer
body unread; it changes two numbers of an entry that exists only while its stream runs
(`close` removes it: `coalesced` closes its Visitor), and at most MAX_STREAMS entries exist (past
that, a stream goes unpaced).
DGEMMA_ACKS=0 turns the pacing off: the baseline of scripts/measure_slow_visitor.py.
"""

from __future__ import annotations

import os
import secrets
import threading
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

ACK_PATH = "/dgemma-ack"
MAX_BODY = 64  # "TOKEN SEQ": a 16-character token, a space, a number
MAX_STREAMS = 10_000
QUICK_ROUND_TRIP_S = 1.0
# A stream's first frame is whole (30-70 KB, 2-6 s at 0.1 Mbit/s), but a client that never
# acknowledges must not be held back long: at 10 s, a cancelled gradio_client stream left the
# ZeroGPU worker's loop running (docs/reliability.md); 1 s costs a slow visitor a few frames.
FIRST_ACK_S = 1.0
PACED = os.environ.get("DGEMMA_ACKS", "1") != "0"


class _Stream:
    __slots__ = ("drawn", "first_sent_at", "round_trip", "sent", "sent_at")

    def __init__(self) -> None:
        self.sent = 0  # the last frame's sequence number (1, 2, ...)
        self.drawn = 0  # the last one the page said it drew (0: it never said)
        self.first_sent_at = 0.0
        self.sent_at = [0.0, 0.0]  # when the last two frames were sent: [seq - 1, seq]
        self.round_trip = float("inf")  # from sending a frame to its page saying it drew it, the last measured


class Acks:
    """The streams that are running, and how far each one's page has drawn."""

    def __init__(self, max_streams: int = MAX_STREAMS, first_ack_s: float = FIRST_ACK_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.max_streams, self.first_ack_s, self.clock = max_streams, first_ack_s, clock
        self._streams: dict[str, _Stream] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._streams)

    def open(self) -> str:
        """A new stream's token (registered unless MAX_STREAMS are running: then it is never paced)."""
        token = secrets.token_urlsafe(12)  # 16 characters
        with self._lock:
            if len(self._streams) < self.max_streams:
                self._streams[token] = _Stream()
        return token

    def close(self, token: str) -> None:
        """The stream has ended: its entry goes (a later acknowledgement of it is ignored)."""
        with self._lock:
            self._streams.pop(token, None)

    def sent(self, token: str) -> int:
        """The stream sends a frame: its sequence number (0 for a stream not registered)."""
        with self._lock:
            stream = self._streams.get(token)
            if stream is None:
                return 0
            stream.sent += 1
            now = self.clock()
            if stream.sent == 1:
                stream.first_sent_at = now
            stream.sent_at = [stream.sent_at[1], now]
            return stream.sent

    def drawn(self, token: str, seq: int) -> bool:
        """The page drew frame `seq` of the stream `token`; False (and nothing changes) for an unknown
        token or a frame that was never sent."""
        with self._lock:
            stream = self._streams.get(token)
            if stream is None or not 0 < seq <= stream.sent:
                return False
            if seq > stream.drawn and seq >= stream.sent - 1:
                stream.round_trip = self.clock() - stream.sent_at[seq - stream.sent + 1]
            stream.drawn = max(stream.drawn, seq)
            return True

    def in_flight(self, token: str) -> int:
        """Frames sent and not yet drawn; 0 once the first frame has waited FIRST_ACK_S for its page
        to say it drew it and it never has (a client that does not acknowledge)."""
        stream = self._streams.get(token)
        if stream is None:
            return 0
        if stream.drawn == 0 and self.clock() - stream.first_sent_at >= self.first_ack_s:
            return 0
        return stream.sent - stream.drawn

    def holding(self, token: str) -> bool:
        """A frame sent now would wait behind frames the page has not drawn: one in flight, or two
        where the page drew the last within QUICK_ROUND_TRIP_S."""
        stream = self._streams.get(token)
        window = 2 if stream is not None and stream.round_trip < QUICK_ROUND_TRIP_S else 1
        return self.in_flight(token) >= window


ACKS = Acks()  # the app's: the streams' Visitors and the route share it

Scope = MutableMapping[str, Any]
ASGIApp = Callable[[Scope, Callable, Callable], Awaitable[None]]


def parse(body: bytes) -> tuple[str, int] | None:
    """("TOKEN", SEQ) from b"TOKEN SEQ", or None."""
    parts = body.split()
    if len(parts) != 2 or not parts[1].isdigit() or len(parts[1]) > 9:
        return None
    try:
        return parts[0].decode("ascii"), int(parts[1])
    except UnicodeDecodeError:
        return None


class AckRoute:
    """ASGI: POST ACK_PATH "TOKEN SEQ" marks that frame drawn in `acks`; every other request passes."""

    def __init__(self, app: ASGIApp, acks: Acks = ACKS) -> None:
        self.app = app
        self.acks = acks

    async def __call__(self, scope: Scope, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http" or not scope["path"].endswith(ACK_PATH):
            await self.app(scope, receive, send)
            return
        if scope["method"] != "POST":
            await _answer(send, 405)
            return
        body = await _body(scope, receive)
        if body is None:
            await _answer(send, 413)
            return
        ack = parse(body)
        if ack is not None:
            self.acks.drawn(*ack)
        await _answer(send, 204)


async def _body(scope: Scope, receive: Callable) -> bytes | None:
    """The request's body, or None when it is (or says it is) longer than MAX_BODY: no more is read."""
    for key, value in scope.get("headers", ()):
        if key.lower() == b"content-length" and (not value.isdigit() or int(value) > MAX_BODY):
            return None
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if len(body) > MAX_BODY:
            return None
        if not message.get("more_body", False):
            return body


async def _answer(send: Callable, status: int) -> None:
    await send({"type": "http.response.start", "status": status, "headers": [(b"content-length", b"0")]})
    await send({"type": "http.response.body", "body": b""})
