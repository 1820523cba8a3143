"""A public app's disk, on the real app in a real browser: an upload over the cap is refused with one
sentence on the page and nothing of it stays on disk; tabs that run and close leave the disk as it
was; and, small, the hostile-visitor bench (`python -m dgemma.bench hostile`) holds its cap while an
ordinary visitor's Run completes."""

from __future__ import annotations

import argparse
import contextlib
import threading
import time
from pathlib import Path

import httpx
import pytest

from app_server import MODEL_ARGS, launch
from browser_page import chromium_page
from dgemma.bench.hostile import DOWNLOAD_READY, disk_bytes, run_hostile, upload
from dgemma.serving.held_runs import EVICTED
from vanishing import wait_until

pytestmark = pytest.mark.server  # an app launched with tiny caps of its own

AGE_S = 20
MiB = 2**20


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    """The app with an 8 MiB disk cap (so also an 8 MiB largest upload), a 20 s file age, and room in
    memory for about one run (the embedded model's runs hold a few hundred KiB)."""
    tmp = tmp_path_factory.mktemp("hostile")
    server = launch([*MODEL_ARGS, "--max-disk", "8MiB", "--files-max-age", str(AGE_S), "--max-run-memory", "16KiB"],
                    tmp / "app.log",
                    env={"GRADIO_TEMP_DIR": str(tmp / "files")})
    server.files = tmp / "files" / f"dgemma-files-{server.process.pid}"
    yield server
    server.stop()


def files_in(folder: Path) -> list[str]:
    while True:
        try:
            return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file() and p.name != ".lock")
        except FileNotFoundError:  # a folder swept while it was read: read again
            continue


def watch(folder: Path, seen: set[str], done: threading.Event) -> None:
    """Add every file under `folder` to `seen`, every 0.1 s until `done` is set."""
    while not done.wait(0.1):
        seen.update(files_in(folder))


def test_an_upload_over_the_cap_is_refused_with_one_sentence_on_the_page_and_nothing_stays_on_disk(app, browser, tmp_path):
    big = tmp_path / "big.jsonl"
    big.write_bytes(b"x" * (9 * MiB))
    with chromium_page(browser, app.url) as page:
        page.wait_for_selector("#run:not([disabled])", timeout=60_000)
        with page.expect_file_chooser() as chooser:
            page.click("#load-run")
        chooser.value.set_files(str(big))
        toast = page.locator(".toast-body").first
        toast.wait_for(timeout=60_000)
        assert 'exceed the maximum allowed size of 8.0 Mb: "big.jsonl"' in toast.inner_text()
        # That message is the page's own check (Gradio's max_file_size): it refuses the file before
        # sending a byte, so there is no upload in flight to wait for.
        assert files_in(app.files) == []


def test_a_script_posting_past_the_cap_gets_one_sentence_and_nothing_is_stored(app):
    response = httpx.post(f"{app.url}/gradio_api/upload", files={"files": ("big.jsonl", b"x" * (9 * MiB))}, timeout=60)
    assert response.status_code == 413
    assert response.text == "This file is 9 MB, more than any run file can be (8 MB); it was not stored."
    assert upload(app.url, 9 * MiB, declare=False).startswith("http 411")  # a size not declared: refused too
    assert files_in(app.files) == []


def test_tabs_that_run_and_close_leave_the_disk_as_it_was_within_the_age(app, browser):
    baseline = disk_bytes(app.files)
    # Every run file seen from the first Run on: on a busy machine the first tab's file can pass its
    # age (and go) before the last tab has even loaded, so the files are not all on disk at any one moment.
    ran: set[str] = set()
    done = threading.Event()
    watcher = threading.Thread(target=watch, args=(app.files, ran, done))
    watcher.start()
    with contextlib.ExitStack() as open_tabs:
        try:
            tabs = []
            for _ in range(3):
                tabs.append(open_tabs.enter_context(chromium_page(browser, app.url)))
                click_run(tabs[-1])
            for tab in tabs:
                tab.wait_for_function(DOWNLOAD_READY, timeout=120_000)
        finally:
            done.set()
            watcher.join()
        ran.update(files_in(app.files))
        assert len(ran) == 3, ran  # one run file per tab, no copy
    closed = time.monotonic()  # the tabs closed
    wait_until(lambda: disk_bytes(app.files) <= baseline, bound_s=AGE_S, period_s=0.25)
    assert disk_bytes(app.files) == baseline, files_in(app.files)
    print(f"run files gone {time.monotonic() - closed:.1f} s after their tabs closed")


def test_when_memory_is_full_the_least_recently_used_idle_run_goes_and_its_tab_says_so_in_one_sentence(app, browser):
    with chromium_page(browser, app.url) as first:
        click_run(first)
        first.wait_for_function(DOWNLOAD_READY, timeout=120_000)
        with chromium_page(browser, app.url) as second:  # opened once the first is idle
            click_run(second)
            second.wait_for_function(DOWNLOAD_READY, timeout=120_000)
            first.click("#play")
            toast = first.locator(".toast-body").first
            toast.wait_for(timeout=30_000)  # a busy CI machine: the two apps' pages and another worker's tests
            assert EVICTED in toast.inner_text()
            second.click("#play")  # the run held last is still there
            try:
                second.wait_for_function(REPLAYING, timeout=30_000)
            except Exception:  # what the tab says instead: its status line and any toast
                said = [second.locator("#status").inner_text(), *second.locator(".toast-body").all_inner_texts()]
                raise AssertionError(said) from None


REPLAYING = "() => document.querySelector('#status').innerText.startsWith('Replay of the run')"


def click_run(tab) -> None:
    """Run, once the tab's page has enabled it."""
    tab.wait_for_selector("#run:not([disabled])", timeout=60_000)
    tab.click("#run")


@pytest.mark.browser  # the bench drives chromium itself
def test_the_hostile_bench_keeps_disk_under_its_cap_and_returns_it_while_an_ordinary_visitor_runs():
    # The module's age, 20 s: at 8 s a busy machine let the ordinary visitor's run file age out
    # between its run's end and its download.
    args = argparse.Namespace(max_disk=24 * 2**20, age=AGE_S, oversized=6, junk=6, api_calls=4, tabs=2, tabs_at_once=1,
                              concurrency=8, model=MODEL_ARGS[1] if MODEL_ARGS else None)
    row = run_hostile(args)
    assert row["outcomes"]["oversized"] and "http 200" not in row["outcomes"]["oversized"], row
    assert row["disk_mib"]["most_during"] <= 24 and row["disk_back_to_baseline_s_after_attack"] is not None, row
    assert row["ordinary_visitor"]["result"].startswith("ran, its file loads"), row
    assert row["outcomes"]["api record"] == {"recorded": 4} and row["server_alive_after"], row
