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


class _Stream:
    __slots__ = ("by_acks", "drawn", "round_trip", "sent", "sent_at")

    def __init__(self, by_acks: bool) -> None:
        self.by_acks = by_acks  # paced by the window (its page acknowledges), else the plain rate
        self.sent = 0  # the last frame's sequence number (1, 2, ...)
        self.drawn = 0  # the last one the page said it drew (0: it never said)
        self.sent_at = [0.0, 0.0]  # when the last two frames were sent: [seq - 1, seq]
        self.round_trip = float("inf")  # from sending a frame to its page saying it drew it, the last measured


class Acks:
    """The streams that are running, and how far each one's page has drawn."""

    def __init__(self, max_streams: int = MAX_STREAMS, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_streams, self.clock = max_streams, clock
        self._streams: dict[str, _Stream] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._streams)

    def open(self, by_acks: bool) -> str:
        """A new stream's token (registered unless MAX_STREAMS are running: then it goes at the plain rate)."""
        token = secrets.token_urlsafe(12)  # 16 characters
        with self._lock:
            if len(self._streams) < self.max_streams:
                self._streams[token] = _Stream(by_acks)
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
            stream.sent_at = [stream.sent_at[1], self.clock()]
            return stream.sent

    def drawn(self, token: str, seq: int) -> bool:
        """The page drew frame `seq` of the stream `token` (from now on it is paced by its window); False
        (and nothing changes) for an unknown token or a frame that was never sent."""
        with self._lock:
            stream = self._streams.get(token)
            if stream is None or not 0 < seq <= stream.sent:
                return False
            if seq > stream.drawn and seq >= stream.sent - 1:
                stream.round_trip = self.clock() - stream.sent_at[seq - stream.sent + 1]
            stream.drawn = max(stream.drawn, seq)
            stream.by_acks = True
            return True

    def in_flight(self, token: str) -> int:
        """Frames sent and not yet drawn, of a stream paced by its page (0 for one at the plain rate)."""
        stream = self._streams.get(token)
        return stream.sent - stream.drawn if stream is not None and stream.by_acks else 0

    def holding(self, token: str) -> bool:
        """A frame sent now would wait behind frames the page has not drawn: one in flight, or two
        where the page drew the last within QUICK_ROUND_TRIP_S."""
        stream = self._streams.get(token)
        window = 2 if stream is not None and stream.round_trip < QUICK_ROUND_TRIP_S else 1
        return self.in_flight(token) >= window


ACKS = Acks()  # the app's: the streams' paces and the route share it


class Pace:
    """One stream's pacing: whether a frame may go now (`ready`), and the frame sent (`stamp`)."""

    def __init__(self, by_acks: bool, acks: Acks = ACKS) -> None:
        self.acks = acks
        self.token = acks.open(by_acks)
        self.skipped = self.sent = self.most_in_flight = 0

    def ready(self) -> bool:
        """A frame due now may go: the page has drawn enough of those sent (or it is not paced by its page)."""
        self.most_in_flight = max(self.most_in_flight, self.acks.in_flight(self.token))
        if self.acks.holding(self.token):
            self.skipped += 1
            return False
        return True

    def stamp(self, frame: dict) -> dict:
        """`frame` (a compact frame, dgemma/ui/compact.py), sent: with this stream's token and its number,
        which the page posts back once it has drawn it."""
        self.sent += 1
        return {**frame, "ack": self.token, "seq": self.acks.sent(self.token)}

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
        ack = parse(body)
        if ack is not None:
            self.acks.drawn(*ack)
        response = Response(status_code=204)
        # A Space's page is in another site's frame, behind a proxy that ends TLS: only a partitioned cookie keeps.
        https = "https" in (request.url.scheme, request.headers.get("x-forwarded-proto"))
        response.set_cookie(COOKIE, "1", path="/", httponly=True, secure=https, samesite="none" if https else "lax")
        if https:  # Python's cookies write the Partitioned attribute only from 3.14 on
            name, value = response.raw_headers[-1]
            response.raw_headers[-1] = (name, value + b"; Partitioned")
        return response
