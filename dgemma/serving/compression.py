"""Compress the page's event stream: every frame of the live view reaches the browser through it.

Gradio sends every result of a page's events (a live run's frames, a replay's steps) as
server-sent events on one `text/event-stream` response per page, and compresses only files
(its Brotli middleware looks at the path's extension): a frame went over the wire as large as it
was made. `CompressedEventStream` is ASGI middleware that encodes such a response with brotli
(when the browser accepts it: browsers offer it over HTTPS, as on a Space) or gzip (they always
do), flushed after every chunk the app sends, so each frame is decodable the moment it arrives,
and the stream's later frames are coded against the earlier ones. At the released model's scale
a compact frame of 150 KB goes as 30-40 KB (docs/benchmarks.md). The stream's socket keeps little
unsent (dgemma/serving/send_buffer.py). Other responses pass untouched.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable

import brotli
from starlette.datastructures import Headers, MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from dgemma.serving.send_buffer import cap_send_buffer

GZIP_LEVEL = 6
BROTLI_QUALITY, BROTLI_WINDOW = 4, 18  # 1 ms a 150 KB frame; a 256 KB window holds the frame before


def _encoder(accept: str) -> tuple[str, Callable[[bytes, bool], bytes]] | None:
    """(Content-Encoding, encode(chunk, last)) for what the client accepts, or None."""
    offered = {part.split(";")[0].strip().lower() for part in accept.split(",")}
    if "br" in offered:
        br = brotli.Compressor(quality=BROTLI_QUALITY, lgwin=BROTLI_WINDOW)
        return "br", lambda chunk, last: br.process(chunk) + (br.finish() if last else br.flush())
    if "gzip" in offered:
        gz = zlib.compressobj(GZIP_LEVEL, zlib.DEFLATED, 31)
        return "gzip", lambda chunk, last: gz.compress(chunk) + gz.flush(zlib.Z_FINISH if last else zlib.Z_SYNC_FLUSH)
    return None


class CompressedEventStream:
    """ASGI middleware: `text/event-stream` responses compressed, flushed per chunk; the rest untouched."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        accept = Headers(scope=scope).get("accept-encoding", "")
        encode: Callable[[bytes, bool], bytes] | None = None

        async def compressing(message: Message) -> None:
            nonlocal encode
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                chosen = None
                stream = headers.get("content-type", "").startswith("text/event-stream")
                if stream:  # a slow link then holds up Gradio's writer within a frame or two (backlog.py)
                    cap_send_buffer(scope)
                if stream and "content-encoding" not in headers:
                    chosen = _encoder(accept)
                if chosen is not None:
                    name, encode = chosen
                    headers["Content-Encoding"] = name
                    headers.add_vary_header("Accept-Encoding")
                    if "content-length" in headers:
                        del headers["content-length"]
            elif message["type"] == "http.response.body" and encode is not None:
                last = not message.get("more_body", False)
                message = {**message, "body": encode(message.get("body", b""), last)}
            await send(message)

        await self.app(scope, receive, compressing)
