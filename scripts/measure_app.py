"""Measure the app as a user meets it: seconds to ready, and live updates per second at 32 requests.

    python scripts/measure_app.py [--requests 32] [--browser] [--json] [-- app.py flags]

Starts `python app.py` on 127.0.0.1 and a free port and times it until the server answers.
Then drives the Generate tab's own streaming endpoint (the one the Run button calls) with N
concurrent requests through gradio_client, counts the frames the page would receive per second,
and meanwhile times GET / every 0.5 s to check the server stays responsive.
With --browser it also opens the page in chromium (Playwright), sets N concurrent requests,
clicks Run, and counts the frames the page actually rendered per second (changes of the status
line) and the page's event-loop lag (a 50 ms timer's lateness): is the page responsive?
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_app(port: int, extra: list[str]) -> tuple[subprocess.Popen, float, float]:
    """(process, seconds until the ready line, seconds until GET / answers)."""
    env = {**os.environ, "GRADIO_ANALYTICS_ENABLED": "False"}
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, str(ROOT / "app.py"), "--port", str(port), *extra], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    ready_line = None
    for line in proc.stdout:
        if "dgemma app ready" in line:
            ready_line = time.monotonic() - t0
            break
    if ready_line is None:
        raise SystemExit(f"app.py exited with {proc.wait()} before it was ready")
    threading.Thread(target=lambda: [None for _ in proc.stdout], daemon=True).start()  # keep the pipe drained
    urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=30).read()
    return proc, ready_line, time.monotonic() - t0


def measure_stream(url: str, requests: int, max_new_tokens: int) -> dict:
    from gradio_client import Client

    client = Client(url, verbose=False)
    prompts = "add 12+34\nreverse hello\ncount 5 to 12\nstory: big cat, park"
    latencies: list[float] = []
    stop = threading.Event()

    def probe():
        while not stop.is_set():
            t = time.monotonic()
            urllib.request.urlopen(url + "/", timeout=30).read()
            latencies.append(time.monotonic() - t)
            stop.wait(0.5)

    prober = threading.Thread(target=probe, daemon=True)
    job = client.submit(prompts, requests, "auto", 4, "", "reference", max_new_tokens, 48, 0.4, 0.8, 0.1, 0.005, 1, 0, False,
                        api_name="/generate_stream")
    t0 = time.monotonic()
    prober.start()
    stamps = []
    for _ in job:
        stamps.append(time.monotonic() - t0)
    stop.set()
    prober.join()
    wall = time.monotonic() - t0
    # Rate while the run was live: frames between the first and the last, over that time.
    live = (len(stamps) - 1) / (stamps[-1] - stamps[0]) if len(stamps) > 1 and stamps[-1] > stamps[0] else 0.0
    gaps = [b - a for a, b in zip(stamps, stamps[1:])]
    return {
        "requests": requests,
        "frames": len(stamps),
        "run_seconds": round(wall, 2),
        "updates_per_s": round(live, 2),
        "max_gap_s": round(max(gaps), 3) if gaps else None,
        "page_get_p50_s": round(statistics.median(latencies), 3) if latencies else None,
        "page_get_max_s": round(max(latencies), 3) if latencies else None,
        "final_status": str(job.outputs()[-1][3]) if job.outputs() else "",
    }


BROWSER_PROBE = """() => {
  window.__frames = []; window.__lag = [];
  let last = performance.now();
  setInterval(() => { const now = performance.now(); window.__lag.push(now - last - 50); last = now; }, 50);
  new MutationObserver(() => window.__frames.push(performance.now()))
    .observe(document.querySelector('#status'), {subtree: true, childList: true, characterData: true});
}"""


def measure_browser(url: str, requests: int) -> dict:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium",
                                    args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"])
        page = browser.new_page(viewport={"width": 1360, "height": 1000})
        page.goto(url, wait_until="load")
        for selector in ("#run", "#cards", "#status"):
            page.wait_for_selector(selector)
        box = page.locator("input[type=number]").first
        box.fill(str(requests))
        box.press("Enter")
        page.evaluate(BROWSER_PROBE)
        page.click("#run")
        page.wait_for_function(
            f"() => document.querySelectorAll('#cards .card.status-done').length === {requests}", timeout=600_000
        )
        frames, lag = page.evaluate("() => [window.__frames, window.__lag]")
        browser.close()
    span = (frames[-1] - frames[0]) / 1000 if len(frames) > 1 else 0
    lag = sorted(lag)
    return {
        "browser_frames": len(frames),
        "browser_updates_per_s": round((len(frames) - 1) / span, 2) if span else 0.0,
        "browser_lag_p50_ms": round(lag[len(lag) // 2], 1) if lag else None,
        "browser_lag_p95_ms": round(lag[int(len(lag) * 0.95)], 1) if lag else None,
        "browser_lag_max_ms": round(lag[-1], 1) if lag else None,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=32)
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--json", action="store_true")
    p.add_argument("--browser", action="store_true", help="also measure the page in chromium")
    p.add_argument("app_args", nargs="*", help="extra flags for app.py (after --)")
    args = p.parse_args()
    port = free_port()
    proc, ready_line_s, first_page_s = start_app(port, args.app_args)
    try:
        stream = measure_stream(f"http://127.0.0.1:{port}", args.requests, args.max_new_tokens)
        if args.browser:
            stream.update(measure_browser(f"http://127.0.0.1:{port}", args.requests))
    finally:
        proc.terminate()
        proc.wait(timeout=20)
    result = {"startup_ready_line_s": round(ready_line_s, 2), "startup_first_page_s": round(first_page_s, 2), **stream}
    print(json.dumps(result) if args.json else "\n".join(f"{k:>22}: {v}" for k, v in result.items()))


if __name__ == "__main__":
    main()
