"""Loading a run file over a slow uplink says how far its upload has come, then shows the run.

A real run (the app's /generate with `record`, the embedded model) is uploaded through "Load a run"
in chromium, its uplink emulated with the Chrome DevTools Protocol so slow that the upload takes a
few seconds; every text the note under the upload area shows is kept, in the page, as it changes. The figures at real scale (a twin
run of megabytes over 2 Mbit/s) are measured by scripts/measure_upload.py (docs/benchmarks.md).
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from gradio_client import Client

from browser_page import chromium_page
from test_playback import status

UPLINK_BYTES_S = 25_000  # 0.2 Mbit/s: a run file of 8 requests takes a few seconds to go up
UPLOADING = re.compile(r"Uploading (\S+): ([\d.]+ [KM]B) of ([\d.]+ [KM]B) \((\d+) %\)")
# Every text of the note, in order, as the page shows it (a MutationObserver: no sampling misses one).
KEEP_NOTES = """() => { window.notes = [];
  new MutationObserver(() => window.notes.push(document.querySelector('.upload-note').textContent))
    .observe(document.querySelector('.upload-note'), {childList: true, characterData: true, subtree: true}); }"""


def shown(size: int) -> str:
    """A size as the note writes it."""
    return f"{size / 1e6:.1f} MB" if size >= 1e5 else f"{size / 1e3:.0f} KB"


def count_requests(page) -> None:
    """Keep `page.in_flight`: the requests the page has made that have not ended (its session's heartbeat, a
    stream that lasts as long as the page, left out)."""
    page.in_flight = set()
    page.on("request", lambda request: "/heartbeat/" in request.url or page.in_flight.add(request))
    for ended in ("requestfinished", "requestfailed"):
        page.on(ended, lambda request: page.in_flight.discard(request))


def wait_for_quiet(page, quiet_s: float = 0.5, bound_s: float = 60) -> None:
    """Until no request of the page's has been in flight for `quiet_s` (Playwright's "networkidle" never comes:
    the heartbeat stays open)."""
    deadline, quiet_since = time.monotonic() + bound_s, None
    while time.monotonic() < deadline:
        page.wait_for_timeout(100)  # the request events arrive while Playwright waits
        quiet_since = None if page.in_flight else quiet_since or time.monotonic()
        if quiet_since is not None and time.monotonic() - quiet_since >= quiet_s:
            return
    raise AssertionError(f"the page still fetches {[request.url for request in page.in_flight]}")


@pytest.fixture(scope="module")
def run_file(app_server, tmp_path_factory) -> Path:
    """A real run of 8 requests, recorded by the app itself."""
    server = app_server
    prompts = ["add 12+34", "reverse hello", "count 5 to 12", "story: big cat, park",
               "sort 3 1 4 1 5", "repeat ab 4", "add 57+68", "story: red fox, river"]  # fmt: skip
    result = Client(server.url, verbose=False).predict(prompts, {"seed": 3, "max_new_tokens": 32, "record": True},
                                                       api_name="/generate")
    path = tmp_path_factory.mktemp("run") / "eight.jsonl"
    path.write_text(result["recording"], encoding="utf-8")
    return path


def test_a_slow_upload_says_how_far_it_has_come_and_ends_at_the_loaded_run(browser, app_server, run_file):
    size = run_file.stat().st_size
    assert size > 3 * UPLINK_BYTES_S  # at least 3 s of upload
    with chromium_page(browser, app_server.url, idle=True, prepare=count_requests) as page:
        # A loaded server's page is "Idle." in its first paint, before it has finished setting up: it still fetches
        # its components' scripts (the upload's progress among them, and Plotly), which the throttled link below
        # would hold back past the upload's end. A visitor picks a file once the page is loaded and the note listens.
        page.wait_for_selector(".upload-note[data-ready]", state="attached", timeout=60_000)
        wait_for_quiet(page)
        cdp = page.context.new_cdp_session(page)
        cdp.send("Network.enable")
        cdp.send("Network.emulateNetworkConditions", {"offline": False, "latency": 40, "downloadThroughput": 4e6 / 8,
                                                      "uploadThroughput": UPLINK_BYTES_S})
        page.evaluate(KEEP_NOTES)
        with page.expect_file_chooser() as chooser:
            page.click("#load-run")
        started = time.monotonic()
        chooser.value.set_files(str(run_file))
        page.wait_for_function("() => window.notes.length > 0 && window.notes.at(-1) === ''"
                               " && /Replay of the run: step 0 of/.test(document.querySelector('#status').innerText)",
                               timeout=45_000)
        took = time.monotonic() - started
        notes = page.evaluate("() => window.notes")
        uploading = [m for m in map(UPLOADING.fullmatch, notes) if m]
        shares = [int(m[4]) for m in uploading]
        assert took > 3 and len(uploading) >= 3, notes  # it advanced, and said so as it did
        assert all(m[1] == "eight.jsonl" and m[3] == shown(size) and m[2][-2:] == m[3][-2:] for m in uploading), notes
        assert shares == sorted(shares) and shares[0] < 50 and any(0 < s < 100 for s in shares), notes
        assert any(n.startswith("Uploaded eight.jsonl") and "reading the run" in n for n in notes), notes
        assert notes[-1] == "" and re.search(r"Replay of the run: step 0 of \d+ \(paused\) · 8 requests", status(page))
