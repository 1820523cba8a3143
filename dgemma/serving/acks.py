"""How fast a stream sends frames: as its page draws them, or at the plain rate (docs/architecture.md,
"Pacing"). A page's script posts "TOKEN SEQ" to ACK_PATH once it has drawn a frame; its stream sends
a frame only while fewer than its window are in flight, so a slow link carries one frame at a time,
the state of the moment it could take it (a skipped frame loses nothing: each is a whole state).
The route is public: every POST gets 204 whatever it holds, a body over MAX_BODY is refused unread,
and at most MAX_STREAMS entries exist (past that, a stream goes at the plain rate)."""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Callable

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

log = logging.getLogger(__name__)

ACK_PATH = "/dgemma-ack"
COOKIE = "dgemma-acks"  # this browser's pages acknowledge the frames they draw
MAX_BODY = 64  # "TOKEN SEQ": a 16-character token, a space, a number
MAX_STREAMS = 10_000
QUICK_ROUND_TRIP_S = 1.0
STALLED_S = 5.0  # a page silent this long after a frame went lost an acknowledgement or a drawing


class Acks:
    """The streams that are running (their `Pace`s, by token), which the route tells what pages drew."""

    def __init__(self, max_streams: int = MAX_STREAMS, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_streams, self.clock = max_streams, clock
        self._streams: dict[str, Pace] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._streams)

    def open(self, pace: Pace) -> str:
        """A new stream's token; "" past MAX_STREAMS running (it then goes at the plain rate)."""
        with self._lock:
            if len(self._streams) >= self.max_streams:
                return ""
            token = secrets.token_urlsafe(12)  # 16 characters
            self._streams[token] = pace
            return token

    def close(self, token: str) -> None:
        with self._lock:
            self._streams.pop(token, None)

    def drawn(self, token: str, seq: int) -> bool:
        """The page drew frame `seq` of the stream `token` (from now on it is paced by its window); False
        (and nothing changes) for an unknown token or a frame that was never sent."""
        with self._lock:
            pace = self._streams.get(token)
            if pace is None or not 0 < seq <= pace.sent:
                return False
            if seq > pace.drawn and seq >= pace.sent - 1:
                pace.round_trip = self.clock() - pace.sent_at[seq - pace.sent + 1]
            pace.drawn, pace.by_acks = max(pace.drawn, seq), True
            return True


ACKS = Acks()  # the app's: the streams' paces and the route share it


class Pace:
    """One stream's pacing: whether a frame may go now (`ready`), and the frame sent (`stamp`)."""

    def __init__(self, by_acks: bool, acks: Acks = ACKS) -> None:
        self.acks = acks
        self.by_acks = by_acks  # paced by the window (its page acknowledges), else the plain rate
        self.sent = self.drawn = 0  # the last frame's sequence number (1, 2, ...); the last the page drew
        self.sent_at = [0.0, 0.0]  # when the last two frames were sent: [sent - 1, sent]
        self.round_trip = float("inf")  # from sending a frame to its page saying it drew it, the last measured
        self.skipped = self.most_in_flight = 0
        self.token = acks.open(self)

    @property
    def in_flight(self) -> int:
        """Frames sent and not yet drawn, of a stream paced by its page (0 at the plain rate)."""
        return self.sent - self.drawn if self.by_acks and self.token else 0

    def ready(self) -> bool:
        """A frame due now may go: fewer than the window are in flight (one, or two where the page drew
        the last within QUICK_ROUND_TRIP_S of its sending), or one past it once the page has been silent
        for STALLED_S since the last went (one lost acknowledgement must not freeze its view)."""
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        stalled = self.acks.clock() - self.sent_at[1] >= STALLED_S
        if self.in_flight >= (2 if self.round_trip < QUICK_ROUND_TRIP_S else 1) + stalled:
            self.skipped += 1
            return False
        return True

    def stamp(self, frame: dict) -> dict:
        """`frame` (a compact frame, dgemma/ui/compact.py), sent: with this stream's token and its number,
        which the page posts back once it has drawn it."""
        with self.acks._lock:
            self.sent += 1
            self.sent_at = [self.sent_at[1], self.acks.clock()]
        return {**frame, "ack": self.token, "seq": self.sent if self.token else 0}

    def close(self) -> None:
        """The stream has ended: its page's acknowledgements are no longer kept; one log line if it held frames back."""
        self.acks.close(self.token)
        if self.skipped:
            log.info("a visitor behind: %d updates skipped, %d sent, at most %d frames in flight",
                     self.skipped, self.sent, self.most_in_flight)


def paces_by_acks(request: object) -> bool:
    """Whether the request (a gr.Request) came from a page that acknowledges the frames it draws."""
    try:
        return COOKIE in request.cookies  # type: ignore[attr-defined]
    except (AttributeError, TypeError):  # no HTTP request behind it (a call from Python)
        return False


class AckRoute:
    """ASGI middleware: POST ACK_PATH "TOKEN SEQ" marks that frame drawn in `acks` (an empty body: the
    page says it acknowledges); every other request passes to the app."""

    def __init__(self, app: ASGIApp, acks: Acks = ACKS) -> None:
        self.app = app
        self.acks = acks

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].endswith(ACK_PATH):
            await self.app(scope, receive, send)
            return
        response = await self.answer(Request(scope, receive))
        await response(scope, receive, send)

    async def answer(self, request: Request) -> Response:
        if request.method != "POST":
            return Response(status_code=405)
        declared = request.headers.get("content-length", "0")
        if not declared.isdigit() or int(declared) > MAX_BODY:
            return Response(status_code=413)
        body = b""
        async for chunk in request.stream():
            body += chunk
            if len(body) > MAX_BODY:  # a body longer than it said
                return Response(status_code=413)
        parts = body.split()  # b"TOKEN SEQ" (a token that is not ASCII is no stream's: it decodes to none)
        if len(parts) == 2 and parts[1].isdigit() and len(parts[1]) <= 9:
            self.acks.drawn(parts[0].decode("ascii", "replace"), int(parts[1]))
        response = Response(status_code=204)
        # A Space's page is in another site's frame, behind a proxy that ends TLS: only a partitioned cookie keeps.
        https = "https" in (request.url.scheme, request.headers.get("x-forwarded-proto"))
        response.set_cookie(COOKIE, "1", path="/", httponly=True, secure=https, samesite="none" if https else "lax")
        if https:  # Python's cookies write the Partitioned attribute only from 3.14 on
            name, value = response.raw_headers[-1]
            response.raw_headers[-1] = (name, value + b"; Partitioned")
        return response
