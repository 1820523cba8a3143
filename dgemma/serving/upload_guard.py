"""Uploads sized before they are stored. Gradio refuses a file over its `max_file_size` only once that
many bytes have arrived (a browser checks first, a script does not): here a multipart request must
declare its size, one larger than a run file can be is refused unread, and the rest reserve their
size against the disk cap (`RunFiles.reserve`). Each refusal is one sentence, as plain text."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from dgemma.serving.runfiles import RunFiles

# A multipart body is the file plus its part headers and boundaries: a few hundred bytes.
FORM_OVERHEAD = 64 * 1024


class UploadGuard:
    def __init__(self, app: ASGIApp, files: RunFiles, max_file_bytes: int):
        self.app = app
        self.files = files
        self.max_file_bytes = max_file_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        request = Request(scope, receive)
        if not request.headers.get("content-type", "").lower().startswith("multipart/form-data"):
            await self.app(scope, receive, send)
            return
        length = _declared_length(request)
        if length is None:
            await _refuse(scope, receive, send, 411, "A file upload must say its size (a Content-Length header).")
            return
        if length > self.max_file_bytes + FORM_OVERHEAD:
            await _refuse(scope, receive, send, 413, f"This file is {length / 2**20:.0f} MB, more than any run file can "
                                                     f"be ({self.max_file_bytes / 2**20:.0f} MB); it was not stored.")
            return
        if not self.files.reserve(length):
            await _refuse(scope, receive, send, 507, "The app's disk for visitors' files is full; try again in a few minutes.")
            return
        try:
            await self.app(scope, receive, send)
        finally:
            self.files.unreserve(length)


def _declared_length(request: Request) -> int | None:
    """The body's size as the request declares it; None when it does not (or streams it in chunks)."""
    value = request.headers.get("content-length")
    if value is None or "transfer-encoding" in request.headers or not value.isdigit():
        return None
    return int(value)


async def _refuse(scope: Scope, receive: Receive, send: Send, status: int, sentence: str) -> None:
    await PlainTextResponse(sentence, status_code=status, headers={"connection": "close"})(scope, receive, send)
