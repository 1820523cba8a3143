"""The files visitors cause: one directory per start, a tab's files go with it, every file has an
age, all of them a total with the oldest removed first, and an upload is sized before it is stored."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from datetime import datetime

import pytest

from dgemma.serving.runfiles import LOCK, PREFIX, RunFiles, remove_abandoned
from dgemma.serving.runfiles import FORM_OVERHEAD, UploadGuard
from fake_clock import Clock

MiB = 2**20


def writer(size: int):
    return lambda path: open(path, "wb").write(b"x" * size)


def on_disk(files: RunFiles) -> tuple[int, int]:
    """The files in the directory and their bytes, counted off the disk (the lock aside)."""
    paths = [p for p in files.root.rglob("*") if p.is_file() and p.name != LOCK]
    return len(paths), sum(p.stat().st_size for p in paths)


def aged(path: str, seconds: float) -> None:
    then = time.time() - seconds
    os.utime(path, (then, then))


@pytest.fixture
def files(tmp_path):
    store = RunFiles.for_this_start(max_bytes=10 * MiB, max_age_s=60, parent=tmp_path)
    yield store
    store.close()


def test_a_start_begins_with_an_empty_directory_of_its_own(tmp_path):
    first = RunFiles.for_this_start(10 * MiB, 60, parent=tmp_path)
    first.save("tab", writer(1000))
    first._lock_file.close()  # the process "died": its lock is free, its files stay behind
    second = RunFiles.for_this_start(10 * MiB, 60, parent=tmp_path)
    try:
        assert second.root.name == f"{PREFIX}{os.getpid()}" and on_disk(second)[0] == 0
    finally:
        second.close()
    assert not second.root.exists()  # a clean stop leaves nothing


@pytest.mark.server  # another process holds the running app's lock
def test_the_directory_of_an_app_that_is_still_running_is_left_alone_and_that_of_one_gone_removed(tmp_path):
    holder = ("import sys; from dgemma.serving.runfiles import RunFiles; "
              "f = RunFiles.for_this_start(2**20, 60, parent=sys.argv[1]); print(f.root, flush=True); sys.stdin.read()")
    running = subprocess.Popen([sys.executable, "-c", holder, str(tmp_path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               text=True)  # it holds its directory until killed (or its stdin closes)
    try:
        alive = running.stdout.readline().strip()
        assert remove_abandoned(tmp_path) == [] and os.path.isdir(alive)
    finally:
        running.kill()
        running.wait()
    assert [str(p) for p in remove_abandoned(tmp_path)] == [alive] and not os.path.exists(alive)


def test_a_tab_keeps_only_its_last_run_file_and_closing_it_removes_that(files):
    first = files.save("tab", writer(1000))
    second = files.save("tab", writer(2000))
    other = files.save("other tab", writer(3000))
    assert not os.path.exists(first) and os.path.getsize(second) == 2000
    assert files.release("tab") == 2000 and not os.path.exists(second) and os.path.exists(other)
    assert on_disk(files)[1] == 3000


def test_a_file_past_its_age_goes_by_gradios_own_delete_cache(tmp_path, monkeypatch):
    import gradio as gr
    from gradio import route_utils

    # Gradio ages a file by datetime.now() against its ctime, which no test can set back: its clock
    # is the one moved here (by hand, past the age), not the machine's.
    clock = Clock()
    monkeypatch.setattr(route_utils, "datetime", type("ClockedDatetime", (datetime,), {
        "now": classmethod(lambda cls, tz=None: datetime.fromtimestamp(clock(), tz))}))
    store = RunFiles.for_this_start(10 * MiB, max_age_s=1, parent=tmp_path)
    monkeypatch.setenv("GRADIO_TEMP_DIR", str(store.root))  # as app.py sets it before Gradio is imported
    try:
        with gr.Blocks(delete_cache=store.delete_cache()) as demo:
            download = gr.DownloadButton()
        paths = [store.save("a", writer(1000)), store.save("b", writer(1000))]
        for path in paths:  # served as a Download run button serves it: from this directory, as is
            assert download.move_resource_to_block_cache(path) == path
        made = max(os.stat(path).st_ctime for path in paths)
        assert demo.delete_cache == (2, 1)  # Gradio runs the deletion every 2 s, for files over 1 s old
        clock.now = made + 0.5
        route_utils.delete_files_created_by_app(demo, demo.delete_cache[1])
        assert all(os.path.exists(path) for path in paths)  # within their age: kept
        clock.now = made + 1.5
        route_utils.delete_files_created_by_app(demo, demo.delete_cache[1])
        assert not any(os.path.exists(path) for path in paths)  # past it: gone
    finally:
        store.close()


def test_past_the_total_cap_the_oldest_files_go_first(files):
    paths = []
    for i in range(4):
        paths.append(files.save(f"tab {i}", writer(3 * MiB)))
        aged(paths[-1], 40 - i)  # tab 0's is the oldest
    assert [os.path.exists(p) for p in paths] == [False, True, True, True]
    assert on_disk(files)[1] == 9 * MiB <= files.max_bytes


def test_past_the_most_files_the_oldest_go_first(files, monkeypatch):
    import dgemma.serving.runfiles

    monkeypatch.setattr(dgemma.serving.runfiles, "MAX_FILES", 3)
    paths = []
    for i in range(5):
        paths.append(files.save(f"tab {i}", writer(10)))
        aged(paths[-1], 50 - i)
    assert [os.path.exists(p) for p in paths] == [False, False, True, True, True] and on_disk(files)[0] == 3


def test_a_file_larger_than_the_cap_is_not_kept(files):
    with pytest.raises(OSError, match="passes the app's disk cap of 10 MiB"):
        files.save("tab", writer(11 * MiB))
    assert on_disk(files)[0] == 0


def test_an_upload_once_read_is_removed_and_a_path_outside_the_directory_never(files, tmp_path):
    upload = files.root / ("0123abcd" * 8) / "run.jsonl"  # where Gradio stores an upload: a folder named by its hash
    upload.parent.mkdir()
    upload.write_text("x")
    outside = tmp_path / "mine.txt"
    outside.write_text("keep")
    assert files.remove(str(upload)) == 1 and not upload.parent.exists()
    assert files.remove(str(outside)) == 0 and outside.exists()
    assert files.remove(str(files.root / LOCK)) == 0


# ---------------------------------------------------------------- the upload guard (a real ASGI call)


def call(guard: UploadGuard, headers: dict[str, str]) -> tuple[int | None, str, bool]:
    """POST through `guard` to an app that records whether it was reached: (status, body, reached)."""
    reached, sent = [], []

    async def app(scope, receive, send):
        reached.append(guard.files._reserved)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"stored"})

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        sent.append(message)

    guard.app = app
    scope = {"type": "http", "method": "POST", "path": "/gradio_api/upload",
             "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()]}
    asyncio.run(guard(scope, receive, send))
    return sent[0]["status"], sent[1]["body"].decode(), bool(reached)


FORM = "multipart/form-data; boundary=x"


def test_an_upload_larger_than_a_run_file_is_refused_by_its_declared_size_before_it_is_read(files):
    guard = UploadGuard(None, files, max_file_bytes=4 * MiB)
    status, body, reached = call(guard, {"content-type": FORM, "content-length": str(4 * MiB + FORM_OVERHEAD + 1)})
    assert (status, reached) == (413, False) and body == "This file is 4 MB, more than any run file can be (4 MB); it was not stored."


def test_an_upload_that_does_not_say_its_size_is_refused(files):
    status, body, reached = call(UploadGuard(None, files, 4 * MiB), {"content-type": FORM, "transfer-encoding": "chunked"})
    assert (status, reached) == (411, False) and body.endswith("(a Content-Length header).")


def test_an_upload_makes_room_by_removing_the_oldest_files_and_counts_while_it_is_stored(files):
    old = files.save("tab", writer(8 * MiB))
    status, _, reached = call(UploadGuard(None, files, 4 * MiB), {"content-type": FORM, "content-length": str(3 * MiB)})
    assert (status, reached) == (200, True) and not os.path.exists(old) and files._reserved == 0


def test_an_upload_under_way_is_never_removed_to_make_room_its_reservation_counts_it(files):
    assert files.reserve(6 * MiB)
    under_way = files.root / "tmpabc123"  # where Gradio writes an upload as it arrives
    under_way.write_bytes(b"x" * (6 * MiB))
    stored = files.save("tab", writer(2 * MiB))
    assert not files.reserve(5 * MiB)  # 6 under way + 5 > 10: no stored file's removal could make room
    assert under_way.exists() and os.path.exists(stored)
    assert files.reserve(4 * MiB)  # 6 + 2 stored + 4 > 10: the stored file goes, the one under way stays
    assert under_way.exists() and not os.path.exists(stored)


def test_an_upload_refused_when_uploads_under_way_fill_the_cap(files):
    assert files.reserve(8 * MiB)  # another visitor's upload, under way
    status, body, reached = call(UploadGuard(None, files, 4 * MiB), {"content-type": FORM, "content-length": str(3 * MiB)})
    assert (status, reached) == (507, False) and body.startswith("The app's disk for visitors' files is full")


def test_requests_that_are_not_uploads_pass_untouched(files):
    status, body, reached = call(UploadGuard(None, files, 4 * MiB), {"content-type": "application/json"})
    assert (status, body, reached) == (200, "stored", True)


# ---------------------------------------------------------------- an upload, once read


def test_an_uploaded_run_file_is_read_and_removed_and_so_is_one_that_is_not_a_run(files):
    import gradio as gr

    from dgemma.serving.held_runs import HeldRuns
    from dgemma.recording import Recording
    from dgemma.serving.runs import Keeping, RunService

    service = RunService(None, Keeping(files, HeldRuns(2**30)))  # no backend: reading a file runs nothing
    folder = files.root / ("ab" * 32)  # where Gradio stores an upload
    folder.mkdir()
    run, junk = folder / "run.jsonl", files.root / ("cd" * 32) / "junk.jsonl"
    Recording().save(str(run))
    junk.parent.mkdir()
    junk.write_bytes(b"\x89PNG\r\n")
    assert service.read_upload(None, str(run)).steps == 0 and not run.exists() and not folder.exists()
    with pytest.raises(gr.Error, match="not a dgemma run: it is not text"):
        service.read_upload(None, str(junk))
    assert on_disk(files)[0] == 0
