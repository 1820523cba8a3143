"""The compressed event stream: each event is decodable as soon as its chunk is sent, the
decoded stream equals what the app sent, and nothing but event streams is touched."""

from __future__ import annotations

import asyncio
import json
import zlib

import brotli
import pytest
from starlette.applications import Starlette
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from dgemma.serving.compression import CompressedEventStream

EVENTS = [f"data: {json.dumps({'msg': 'process_generating', 'frame': i, 'cells': 'ABCab' * 400})}\n\n".encode()
          for i in range(5)]


async def events(request):
    async def body():
        for event in EVENTS:
            yield event
    return StreamingResponse(body(), media_type="text/event-stream")


async def info(request):
    return JSONResponse({"cells": "ABCab" * 400})


APP = CompressedEventStream(Starlette(routes=[Route("/queue/data", events), Route("/info", info)]))


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


@pytest.mark.parametrize("accept, encoding", [("gzip, deflate", "gzip"), ("gzip, deflate, br, zstd", "br")])
def test_each_event_decodes_the_moment_its_chunk_arrives(accept, encoding):
    headers, chunks = call("/queue/data", accept)
    assert headers["content-encoding"] == encoding and "content-length" not in headers
    decoder = zlib.decompressobj(31) if encoding == "gzip" else brotli.Decompressor()
    decode = decoder.decompress if encoding == "gzip" else decoder.process
    decoded = [decode(chunk) for chunk in chunks]
    assert decoded[: len(EVENTS)] == EVENTS and b"".join(decoded) == b"".join(EVENTS)
    assert sum(map(len, chunks)) < len(b"".join(EVENTS)) / 10  # later events are coded against the first


def test_a_client_that_accepts_no_compression_gets_the_stream_as_sent():
    headers, chunks = call("/queue/data", "identity")
    assert "content-encoding" not in headers and b"".join(chunks) == b"".join(EVENTS)


def test_responses_other_than_event_streams_pass_untouched():
    headers, chunks = call("/info", "gzip, br")
    assert "content-encoding" not in headers and json.loads(b"".join(chunks)) == {"cells": "ABCab" * 400}
