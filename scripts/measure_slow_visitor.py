"""Measure a visitor whose link cannot keep up: how far behind their page is, and what the server holds.

    python scripts/measure_slow_visitor.py RUN.jsonl [--down 12500] [--latency 40] [--pace 0.25] [--json]

Side by side, per mode: `unpaced` (the baseline: the browser drops every post to the route the page
acknowledges on, so the server takes the page for a client that never acknowledges and sends every
frame at the plain rate) and `acked` (the app as it is: a frame goes only while fewer than the page's
window are in flight, dgemma/serving/acks.py). Each starts `python app.py`, loads RUN (a run
recorded with `python -m dgemma.generate --record`; a real-scale one is the twin at canvas 256) on
the local link, then emulates the slow link in chromium (Chrome DevTools Protocol: --down bytes/s
down and up, 40 ms; 12,500 B/s is 0.1 Mbit/s) and plays the run at --pace s a step. Every 0.5 s it
samples the step the server is at (due by the play clock), the step the page shows (its status
line) and the server's RSS (psutil); it prints the lag (steps and seconds) over time and when the
page shows the last step, the frames the page received against those due, and the RSS's growth.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import threading
import time
from pathlib import Path

import psutil

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parent.parent)]
from measure_app import free_port, start_app

from dgemma.recording import load

# The baseline is the same app whose page's acknowledgements never arrive (the browser drops them).
MODES = ("unpaced", "acked")
SAMPLE_S = 0.5
# Every status line the page shows, with its time: the steps it received.
WATCH = """() => { window.__shown = []; const s = document.querySelector('#status');
  new MutationObserver(() => { const m = /step (\\d+) of/.exec(s.innerText);
    if (m) window.__shown.push([performance.now(), +m[1]]); })
    .observe(s, {subtree: true, childList: true, characterData: true}); return performance.now(); }"""


def shown_step(page) -> int:
    m = re.search(r"Replay of the [a-z ]*run: step (\d+) of", page.inner_text("#status"))
    return int(m[1]) if m else -1


def measure(browser, path: str, mode: str, down: float, pace: float, limit_s: float, latency: float = 40) -> dict:
    steps = load(Path(path).read_bytes()).steps
    port = free_port()
    proc, _, _ = start_app(port, [])
    server = psutil.Process(proc.pid)
    try:
        page = browser.new_page(viewport={"width": 1360, "height": 1000})
        if mode == "unpaced":
            page.route("**/dgemma-ack", lambda route: route.abort())
        cdp = page.context.new_cdp_session(page)
        cdp.send("Network.enable")
        page.goto(f"http://127.0.0.1:{port}", wait_until="load")
        page.wait_for_function("() => document.querySelector('#status')?.innerText.includes('Idle.')", timeout=120_000)
        with page.expect_file_chooser() as chooser:
            page.click("#load-run")
        chooser.value.set_files(path)
        page.wait_for_function("() => /Replay[^]*step 0 of/.test(document.querySelector('#status').innerText)",
                               timeout=120_000)
        pace_box = page.locator("#pace input[type=number]")
        pace_box.fill(str(pace))
        pace_box.press("Enter")
        time.sleep(2.0)  # the step-0 charts, then a quiet server
        rss0 = server.memory_info().rss
        cdp.send("Network.emulateNetworkConditions",
                 {"offline": False, "latency": latency, "downloadThroughput": down, "uploadThroughput": down})
        page_t0 = page.evaluate(WATCH)
        t0 = time.monotonic()
        page.click("#play")
        samples, rss = [], [rss0]
        sampling = True

        def sample_rss() -> None:
            while sampling:
                rss.append(server.memory_info().rss)
                time.sleep(0.1)

        sampler = threading.Thread(target=sample_rss, daemon=True)
        sampler.start()
        while time.monotonic() - t0 < limit_s:
            at = time.monotonic() - t0
            due, shown = min(steps, int(at / pace)), shown_step(page)
            samples.append((round(at, 1), due, shown, rss[-1]))
            if shown == steps:
                break
            time.sleep(SAMPLE_S)
        sampling = False
        sampler.join()
        received = page.evaluate("() => window.__shown")
        last_at = next(((t - page_t0) / 1e3 for t, s in received if s == steps), None)
        cdp.send("Network.emulateNetworkConditions",
                 {"offline": False, "latency": 0, "downloadThroughput": -1, "uploadThroughput": -1})
        page.close()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    told = re.findall(r"a visitor behind: (\d+) updates skipped, (\d+) sent, at most (\d+) frames in flight",
                      "".join(proc.lines))
    lags = [due - shown for _, due, shown, _ in samples if shown >= 0]
    late = sorted(at - shown * pace for at, _, shown, _ in samples if shown >= 0)  # how old the page's view is
    return {
        "mode": mode, "run": Path(path).name, "steps": steps, "pace_s": pace, "down_bytes_per_s": down,
        "frames_due": steps, "frames_received": len({s for _, s in received}),
        "last_step_late_s": round(last_at - steps * pace, 1) if last_at is not None else None,
        "lag_steps_median": sorted(lags)[len(lags) // 2] if lags else None, "lag_steps_max": max(lags, default=None),
        "view_age_s_median": round(late[len(late) // 2], 1) if late else None,
        "view_age_s_max": round(late[-1], 1) if late else None,
        "server_most_in_flight": int(told[-1][2]) if told else None, "server_skipped": int(told[-1][0]) if told else 0,
        "rss_start_mb": round(rss0 / 2**20, 1), "rss_growth_peak_mb": round((max(rss) - rss0) / 2**20, 1),
        "timeline": [(at, due, shown, round(r / 2**20, 1)) for at, due, shown, r in samples[:: max(1, len(samples) // 12)]],
    }  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run")
    p.add_argument("--down", type=float, default=12_500, help="bytes/s down (and up); default 12,500 (0.1 Mbit/s)")
    p.add_argument("--pace", type=float, default=0.25, help="seconds per step of the replay")
    p.add_argument("--latency", type=float, default=40, help="ms each way; `--down -1 --latency 0`: the local link")
    p.add_argument("--limit", type=float, default=400, help="give up on a mode after this many seconds")
    p.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, of {', '.join(MODES)}")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path="/usr/bin/chromium",
                                     args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"])
        results = [measure(browser, args.run, mode, args.down, args.pace, args.limit, args.latency)
                   for mode in args.modes.split(",")]
        browser.close()
    if args.json:
        print(json.dumps(results))
        return
    for key in results[0]:
        if key != "timeline":
            print(f"{key:>22}: " + "  ".join(f"{r[key]!s:>18}" for r in results))
    for r in results:
        print(f"\n{r['mode']}: (seconds, step due, step shown, RSS MB) " + " ".join(map(str, r["timeline"])))


if __name__ == "__main__":
    main()
