"""Uploads sized before they are stored: an ASGI layer in front of the app's routes.

Gradio refuses a file over its `max_file_size` only once that many bytes have arrived, and it
writes them to disk meanwhile; a page's browser checks the size first, a script does not. Here a
file upload (a multipart request) must declare its size (Content-Length), which the server then
enforces: one larger than a run file can be is refused before a byte is read, and the rest reserve
their size in the app's files (`RunFiles.reserve`), so uploads under way count against the disk
cap too, and one that does not fit even after the oldest files are removed is refused. Each
refusal is one sentence, as plain text.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from dgemma.serving.runfiles import RunFiles

Scope = MutableMapping[str, Any]
ASGIApp = Callable[[Scope, Callable, Callable], Awaitable[None]]
# A multipart body is the file plus its part headers and boundaries: a few hundred bytes.
FORM_OVERHEAD = 64 * 1024


class UploadGuard:
    def __init__(self, app: ASGIApp, files: RunFiles, max_file_bytes: int):
        self.app = app
        self.files = files
        self.max_file_bytes = max_file_bytes

    async def __call__(self, scope: Scope, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or not _is_multipart(scope):
            await self.app(scope, receive, send)
            return
        length = _content_length(scope)
        if length is None:
            await _refuse(send, 411, "A file upload must say its size (a Content-Length header).")
            return
        if length > self.max_file_bytes + FORM_OVERHEAD:
            await _refuse(send, 413, f"This file is {length / 2**20:.0f} MB, more than any run file can be "
                                     f"({self.max_file_bytes / 2**20:.0f} MB); it was not stored.")
            return
        if not self.files.reserve(length):
            await _refuse(send, 507, "The app's disk for visitors' files is full; try again in a few minutes.")
            return
        try:
            await self.app(scope, receive, send)
        finally:
            self.files.unreserve(length)


def _header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return value
    return None


def _is_multipart(scope: Scope) -> bool:
    return (_header(scope, b"content-type") or b"").lower().startswith(b"multipart/form-data")


def _content_length(scope: Scope) -> int | None:
    value = _header(scope, b"content-length")
    try:
        return int(value) if value is not None and _header(scope, b"transfer-encoding") is None else None
    except ValueError:
        return None


async def _refuse(send: Callable, status: int, sentence: str) -> None:
    body = sentence.encode("utf-8")
    headers = [(b"content-type", b"text/plain; charset=utf-8"), (b"content-length", str(len(body)).encode()),
               (b"connection", b"close")]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
