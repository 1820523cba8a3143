"""A visitor whose link cannot keep up sees the present, a few seconds late, at a lower rate; the
server queues nothing for them: each frame goes only once their page has drawn the one before
(dgemma/serving/acks.py), and the frames due meanwhile are skipped.

A real-scale run (conftest's `real_scale_run`: the structure twin at canvas 256, 32 requests, 20
steps) is replayed at 0.25 s a step (5 s due) to chromium through an emulated 0.1 Mbit/s link
(12,500 B/s, 40 ms), about a tenth of what its frames need. The page shows the last step at most LATE_S after it was due
(before the page's acknowledgements it was 46-84 s late: chromium's emulation and the sockets took in
0.5-0.7 MB of frames first), having been sent fewer frames than there are steps, and the server's
log says how many frames were ever in flight to it. Lag and memory, before and after, are measured by
scripts/measure_slow_visitor.py (docs/reliability.md). The route the page posts to answers through
the app's middlewares.
"""

from __future__ import annotations

import re

import httpx
from browser_page import chromium_page
from twin import REAL_REQUESTS as REQUESTS
from twin import REAL_STEPS as STEPS

from dgemma.serving.acks import ACK_PATH, MAX_BODY

PACE = 0.25
SLOW_LINK = {"offline": False, "latency": 40, "downloadThroughput": 12_500, "uploadThroughput": 12_500}
FAST_LINK = {"offline": False, "latency": 0, "downloadThroughput": -1, "uploadThroughput": -1}
MOST_IN_FLIGHT = 2  # the window on a quick link; one on this one, two after 5 s without an acknowledgement
LATE_S = 15.0  # measured 5.6 s (docs/reliability.md): one frame in flight and the last one behind it
# Every step the status line shows, once each (the frames the page was sent), and when (ms after Play).
WATCH = """() => { window.__steps = new Map(); const s = document.querySelector('#status'); const t0 = performance.now();
  new MutationObserver(() => { const m = /step (\\d+) of/.exec(s.innerText);
    if (m && !window.__steps.has(+m[1])) window.__steps.set(+m[1], performance.now() - t0); })
    .observe(s, {subtree: true, childList: true, characterData: true});
  document.querySelector('#play').click(); }"""


def test_a_visitor_on_0_1_mbit_sees_the_last_step_within_seconds_of_its_due_time_and_the_server_queues_nothing(
        real_scale_run, browser, app_server):
    server = app_server
    with chromium_page(browser, server.url, idle=True) as page:
        with page.expect_file_chooser() as chooser:
            page.click("#load-run")
        chooser.value.set_files(str(real_scale_run))
        page.wait_for_function("() => /Replay[^]*step 0 of/.test(document.querySelector('#status').innerText)",
                               timeout=60_000)
        pace = page.locator("#pace input[type=number]")
        pace.fill(str(PACE))
        pace.press("Enter")
        cdp = page.context.new_cdp_session(page)
        cdp.send("Network.enable")
        cdp.send("Network.emulateNetworkConditions", SLOW_LINK)
        seen = len(server.log())
        page.evaluate(WATCH)
        page.wait_for_function(f"() => /step {STEPS} of {STEPS}/.test(document.querySelector('#status').innerText)",
                               timeout=120_000)
        cdp.send("Network.emulateNetworkConditions", FAST_LINK)
        shown = dict(page.evaluate("() => [...window.__steps]"))
        done = page.locator("#cards .dgv-cards .card.status-done").count()
        errors = page.errors
    told = re.findall(r"a visitor behind: (\d+) updates skipped, (\d+) sent, at most (\d+) frames in flight",
                      server.log()[seen:])
    assert done == REQUESTS, done  # the last step: every card's final text
    assert shown[STEPS] / 1e3 - STEPS * PACE <= LATE_S, shown
    assert set(range(STEPS + 1)) - set(shown), shown  # steps due while the page was still drawing one were skipped
    assert told and int(told[-1][0]) > 0 and int(told[-1][2]) <= MOST_IN_FLIGHT, told
    assert not errors, errors


def test_the_route_the_page_acknowledges_on_answers_through_the_apps_middlewares(app_server):
    url = app_server.url.rstrip("/") + ACK_PATH
    unknown = httpx.post(url, content="a-stream-that-never-ran 1", timeout=30)
    too_long = httpx.post(url, content="x" * (MAX_BODY + 1), timeout=30)
    assert (unknown.status_code, too_long.status_code) == (204, 413)
