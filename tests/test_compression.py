"""The compressed event stream (app.py's `compression`, Starlette's gzip): each event is decodable as
soon as its chunk is sent, the decoded stream equals what the app sent, and a client that accepts
no compression gets the stream as sent."""

from __future__ import annotations

import asyncio
import json
import zlib

from starlette.applications import Starlette
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from app import compression

EVENTS = [f"data: {json.dumps({'msg': 'process_generating', 'frame': i, 'cells': 'ABCab' * 400})}\n\n".encode()
          for i in range(5)]


async def events(request):
    async def body():
        for event in EVENTS:
            yield event
    return StreamingResponse(body(), media_type="text/event-stream")


async def small(request):
    return JSONResponse({"ok": True})


APP = Starlette(routes=[Route("/queue/data", events), Route("/small", small)], middleware=[compression()])


def call(path: str, accept: str) -> tuple[dict, list[bytes]]:
    """The response's headers and its body chunks, as the server sends them (ASGI, no client between)."""
    sent: list[dict] = []
    scope = {"type": "http", "method": "GET", "path": path, "raw_path": path.encode(), "query_string": b"",
             "headers": [(b"accept-encoding", accept.encode())], "http_version": "1.1", "scheme": "http",
             "server": ("127.0.0.1", 80), "client": ("127.0.0.1", 1), "root_path": ""}

    async def receive():
        await asyncio.sleep(3600)

    async def send(message):
        sent.append(message)

    asyncio.run(APP(scope, receive, send))
    start = next(m for m in sent if m["type"] == "http.response.start")
    headers = {k.decode().lower(): v.decode() for k, v in start["headers"]}
    return headers, [m.get("body", b"") for m in sent if m["type"] == "http.response.body"]


def test_each_event_decodes_the_moment_its_chunk_arrives():
    headers, chunks = call("/queue/data", "gzip, deflate, br, zstd")
    assert headers["content-encoding"] == "gzip" and "content-length" not in headers
    decoder = zlib.decompressobj(31)
    decoded = [decoder.decompress(chunk) for chunk in chunks]
    assert decoded[: len(EVENTS)] == EVENTS and b"".join(decoded) == b"".join(EVENTS)
    assert sum(map(len, chunks)) < len(b"".join(EVENTS)) / 10  # later events are coded against the first


def test_a_client_that_accepts_no_compression_gets_the_stream_as_sent():
    headers, chunks = call("/queue/data", "identity")
    assert "content-encoding" not in headers and b"".join(chunks) == b"".join(EVENTS)


def test_a_small_response_passes_as_sent():
    headers, chunks = call("/small", "gzip")
    assert "content-encoding" not in headers and json.loads(b"".join(chunks)) == {"ok": True}
