"""The files visitors cause, on disk: one directory per start of the app, every file an age, all of them a total.

Gradio's upload folder (GRADIO_TEMP_DIR) is this directory, so Gradio serves a run file saved here
without copying it, and its uploads count under the same caps. A file past `max_age_s` goes by
Gradio's own `delete_cache` (`delete_cache()`: every run file it served and every upload it stored
are its Blocks' temp files). What it does not cover is here: a restart starts clean (earlier
starts' directories whose lock is free go), a closed tab's files go (`release`), past `max_bytes` or
MAX_FILES the oldest go first, and an upload reserves its declared size before a byte is stored:
Gradio refuses a file over its `max_file_size` only once that many bytes have arrived (a browser
checks first, a script does not), so `UploadGuard` makes a multipart request declare its size,
refuses one larger than a run file can be unread and reserves the rest; each refusal is one sentence."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.types import ASGIApp, Receive, Scope, Send

try:
    import fcntl
except ImportError:  # Windows: no lock, so earlier starts' directories are left to the OS's temp cleaning
    fcntl = None  # type: ignore[assignment]

log = logging.getLogger(__name__)

PREFIX = "dgemma-files-"  # one directory per start of the app: PREFIX + its process id
LOCK = ".lock"  # held (flock) for the life of the app: a free lock means its app has gone
SWEEP_PERIOD_S = 2  # how often Gradio's delete_cache looks for files past their age
DEFAULT_MAX_BYTES = 2 * 2**30  # app.py's --max-disk
DEFAULT_MAX_AGE_S = 3600  # app.py's --files-max-age
MAX_FILES = 10_000  # and at most this many: tiny uploads cannot make every save and upload walk millions
FRESH_DIR_S = 60.0  # an empty directory younger than this may be Gradio's, about to receive an upload


class RunFiles:
    def __init__(self, root: str | Path, max_bytes: int, max_age_s: int):
        self.root = Path(os.path.abspath(root))
        self.max_bytes = max_bytes
        self.max_age_s = max_age_s
        self.removed_hooks: list[Callable[[str], None]] = []  # told of every file removed (Gradio's bookkeeping)
        self._by_key: dict[str, set[str]] = {}  # a kept run's key (`runs.keep_key`) -> its files
        self._reserved = 0  # bytes of uploads under way (counted before they are written)
        self._lock = threading.RLock()
        self._lock_file = None

    def delete_cache(self) -> tuple[int, int]:
        """gr.Blocks' `delete_cache`: every SWEEP_PERIOD_S, its temp files past `max_age_s` go."""
        return SWEEP_PERIOD_S, self.max_age_s

    @classmethod
    def for_this_start(cls, max_bytes: int, max_age_s: int, parent: str | Path | None = None) -> RunFiles:
        """A clean directory under `parent` (default: the system's temp dir) for this process, the
        directories of earlier starts that have ended removed."""
        parent = Path(parent or tempfile.gettempdir())
        parent.mkdir(parents=True, exist_ok=True)
        remove_abandoned(parent)
        root = parent / f"{PREFIX}{os.getpid()}"
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir()
        files = cls(root, max_bytes, max_age_s)
        files._lock_file = open(root / LOCK, "w")  # noqa: SIM115 - held open for the app's life
        if fcntl is not None:
            fcntl.flock(files._lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return files

    # ---------------------------------------------------------------- a kept run's files

    def save(self, key: str, write: Callable[[str], None]) -> str:
        """A new file under `key`, written by `write(path)`; the key's earlier files go first
        (a tab keeps its last run), and the oldest of all after it while the total passes the cap.
        OSError if the file alone passes the cap (it is not kept)."""
        self.release(key)
        folder = self.root / "runs"
        folder.mkdir(exist_ok=True)
        stamp = time.strftime("%Y%m%d-%H%M%S")
        fd, path = tempfile.mkstemp(prefix=f"dgemma-run-{stamp}-", suffix=".jsonl", dir=folder)
        os.close(fd)
        try:
            write(path)
        except BaseException:
            self.remove(path)
            raise
        with self._lock:
            self._by_key.setdefault(key, set()).add(path)
            self._fit(keep=path)
            if not os.path.exists(path):
                raise OSError(f"the run's file passes the app's disk cap of {self.max_bytes / 2**20:.0f} MiB")
        return path

    def release(self, key: str) -> int:
        """Remove every file under `key` (its tab closed, or it saved a newer one); the bytes freed."""
        with self._lock:
            paths = self._by_key.pop(key, set())
        return sum(self.remove(p) for p in paths)

    def remove(self, path: str) -> int:
        """Remove `path` if it lies in this directory (an upload once read, an expired file); its size."""
        path = os.path.abspath(path)
        if os.path.commonpath([path, str(self.root)]) != str(self.root) or os.path.basename(path) == LOCK:
            return 0
        try:
            size = os.stat(path).st_size
            os.remove(path)
        except OSError:
            return 0
        for hook in self.removed_hooks:
            hook(path)
        parent = os.path.dirname(path)
        if len(name := os.path.basename(parent)) >= 32 and all(c in "0123456789abcdef" for c in name):
            with contextlib.suppress(OSError):
                os.rmdir(parent)  # Gradio's folder of one upload, now empty
        return size

    # ---------------------------------------------------------------- the directory's total

    def reserve(self, size: int) -> bool:
        """Count `size` bytes about to be written (an upload) against the cap, making room by
        removing the oldest files; False (nothing counted) if the cap cannot hold them."""
        with self._lock:
            if size + self._reserved > self.max_bytes:
                return False
            self._reserved += size
            self._fit()
            if sum(size for _, size, _ in self._stored()) + self._reserved > self.max_bytes:
                self._reserved -= size
                return False
            return True

    def unreserve(self, size: int) -> None:
        with self._lock:
            self._reserved -= size

    def _fit(self, keep: str | None = None) -> None:
        """Remove the oldest stored files (`keep` last) while they and the reserved bytes pass the cap.
        An upload under way (a file Gradio writes at the top of the directory, then moves into a folder
        of its own) is never removed: its reservation counts it."""
        entries = sorted(self._stored(), key=lambda e: (e[2] == keep, e[0]))
        total = sum(size for _, size, _ in entries) + self._reserved
        count = len(entries)
        for _, size, path in entries:
            if total <= self.max_bytes and count <= MAX_FILES:
                break
            if self.remove(path):
                total -= size
                count -= 1

    def _stored(self) -> list[tuple[float, int, str]]:
        """(mtime, size, path) of every file stored in the directory: not those at its top (the lock,
        and an upload under way, which Gradio writes there)."""
        found = []
        for folder, _, names in os.walk(self.root):
            if folder == str(self.root):
                continue
            for name in names:
                with contextlib.suppress(OSError):  # gone meanwhile
                    st = os.stat(path := os.path.join(folder, name))
                    found.append((st.st_mtime, st.st_size, path))
        return found

    def close(self) -> None:
        """Remove the whole directory (the app is stopping)."""
        shutil.rmtree(self.root, ignore_errors=True)
        if self._lock_file is not None:
            self._lock_file.close()


def remove_abandoned(parent: Path) -> list[Path]:
    """Remove the directories of earlier starts under `parent` whose app has gone; those removed."""
    removed = []
    for folder in parent.glob(f"{PREFIX}*"):
        if folder.is_dir() and _abandoned(folder):
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed


def _abandoned(folder: Path) -> bool:
    if fcntl is None:
        return False
    try:
        fd = os.open(folder / LOCK, os.O_RDWR)
    except OSError:  # no lock file: a start under way, or one that never got so far
        with contextlib.suppress(OSError):
            return time.time() - folder.stat().st_mtime > FRESH_DIR_S
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # free: its app has gone (the lock went with it)
        return True
    except BlockingIOError:
        return False  # an app running now holds it
    finally:
        os.close(fd)


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
        declared = request.headers.get("content-length")  # none, or chunked: the body does not say its size
        if declared is None or "transfer-encoding" in request.headers or not declared.isdigit():
            await _refuse(scope, receive, send, 411, "A file upload must say its size (a Content-Length header).")
            return
        length = int(declared)
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


async def _refuse(scope: Scope, receive: Receive, send: Send, status: int, sentence: str) -> None:
    await PlainTextResponse(sentence, status_code=status, headers={"connection": "close"})(scope, receive, send)
