"""Measure the live view in chromium, per run file: bytes per frame on the wire, main-thread CPU per
frame, and how late a 0.25 s-per-step replay ends, on the local link and emulated slower ones.

    python scripts/measure_view.py RUN.jsonl [RUN.jsonl ...] [--links local,10,4] [--json]

Starts `python app.py` (the embedded model; a replay needs none), loads each run (recorded with
`python -m dgemma.generate --record FILE`) with "Load a run", and for every step moves the slider
there: the bytes of the page's event stream on the wire (Chrome DevTools Protocol, encoded) and
decoded, the main thread's CPU milliseconds (Chrome's ThreadTime, which a busy machine does not
inflate) for the whole step (cards, overview, status line and both Plotly charts) and for the
view alone drawn anew (the overview and every card: what a live frame costs), and the bytes of the
same step's full board as JSON (`dgemma.bench.frames.full_board`, the baseline of the compact frame).
Then, per link (Mbit/s down, half that up, 40 ms latency; `local`: no emulation), plays the run at
0.25 s a step and prints how long after its due time the last step was shown, the bytes per
second the replay cost, and the longest task of the page's main thread from play to the end (the
charts redrawn at the last step among them: Chrome's long tasks, over 50 ms; wall time). Bytes per second of a live run are a frame's wire bytes x 6 frames/s.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parent.parent)]
from measure_app import free_port, start_app  # noqa: E402

from dgemma.recording import load  # noqa: E402
from dgemma.ui.board import fold  # noqa: E402
from dgemma.bench.frames import full_board, wire as as_sent  # noqa: E402

LIVE_FRAMES_PER_S = 6.0
PLAY = """() => {
  new MutationObserver(() => { if (/step LAST of LAST/.test(document.querySelector('#status').innerText))
    window.__lastStepAt ??= performance.now(); }).observe(document.querySelector('#status'),
    {subtree: true, childList: true, characterData: true});
  window.__lastStepAt = undefined;
  window.__tasks = [];  // the main thread's long tasks (over 50 ms) from here on: the charts redrawn at the end among them
  if (!window.__watching) new PerformanceObserver((list) => window.__tasks.push(...list.getEntries().map((e) => e.duration)))
    .observe({type: "longtask"});
  window.__watching = true;
  const started = performance.now();
  document.querySelector('#play').click();
  return started;
}"""
PACE = 0.25


def thread_ms(cdp) -> float:
    return 1e3 * next(m["value"] for m in cdp.send("Performance.getMetrics")["metrics"] if m["name"] == "ThreadTime")


def wait_step(page, step: int, steps: int, timeout: float = 120_000) -> None:
    page.wait_for_function(f"() => /Replay[^]*step {step} of {steps}/.test(document.querySelector('#status').innerText)",
                           timeout=timeout)


def link(mbit: str) -> dict:
    if mbit == "local":
        return {"offline": False, "latency": 0, "downloadThroughput": -1, "uploadThroughput": -1}
    down = float(mbit) * 1e6 / 8
    return {"offline": False, "latency": 40, "downloadThroughput": down, "uploadThroughput": down / 2}


def measure_run(browser, url: str, path: str, links: list[str]) -> dict:
    recording = load(Path(path).read_bytes())
    steps = recording.steps
    page = browser.new_page(viewport={"width": 1360, "height": 1000})
    cdp = page.context.new_cdp_session(page)
    cdp.send("Network.enable")
    cdp.send("Performance.enable", {"timeDomain": "threadTicks"})
    urls, chunks = {}, []
    cdp.on("Network.requestWillBeSent", lambda e: urls.__setitem__(e["requestId"], e["request"]["url"]))
    cdp.on("Network.dataReceived", lambda e: chunks.append((e["encodedDataLength"], e["dataLength"]))
           if "/queue/data" in urls.get(e["requestId"], "") else None)
    page.goto(url, wait_until="load")
    page.wait_for_function("() => document.querySelector('#status')?.innerText.includes('Idle.')", timeout=120_000)
    with page.expect_file_chooser() as chooser:
        page.click("#load-run")
    chooser.value.set_files(path)
    wait_step(page, 0, steps)
    time.sleep(1.0)
    wire, decoded, step_ms, view_ms, full_bytes = [], [], [], [], []
    box = page.locator("#step-slider input[type=number]")
    for step in range(1, steps + 1):
        before, cpu = len(chunks), thread_ms(cdp)
        box.fill(str(step))
        box.press("Enter")
        wait_step(page, step, steps)
        time.sleep(1.5)  # the charts draw after the status line
        step_ms.append(thread_ms(cdp) - cpu)
        wire.append(sum(c[0] for c in chunks[before:]))
        decoded.append(sum(c[1] for c in chunks[before:]))
        costs = []
        for _ in range(3):
            cpu = thread_ms(cdp)
            page.evaluate("() => document.querySelector('#cards .dgv').dgvRedraw()")
            costs.append(thread_ms(cdp) - cpu)
        view_ms.append(min(costs))
        full_bytes.append(len(as_sent(full_board(fold(recording.events(step))))))
    result = {
        "run": Path(path).name, "requests": len(recording.header["prompts"]),
        "canvas": recording.header["model"].get("canvas_length"), "steps": steps,
        "wire_bytes_per_step_max": max(wire), "decoded_bytes_per_step_max": max(decoded),
        "full_board_bytes_max": max(full_bytes),
        "live_wire_bytes_per_s": round(statistics.median(wire) * LIVE_FRAMES_PER_S),
        "live_full_board_bytes_per_s": round(statistics.median(full_bytes) * LIVE_FRAMES_PER_S),
        "view_redraw_cpu_ms_max": round(max(view_ms), 1),
        "step_with_charts_cpu_ms_median": round(statistics.median(step_ms), 1),
    }  # fmt: skip
    pace = page.locator("#pace input[type=number]")
    pace.fill(str(PACE))
    pace.press("Enter")
    for name in links:
        cdp.send("Network.emulateNetworkConditions", link(name))
        box.fill("0")
        box.press("Enter")
        wait_step(page, 0, steps)
        page.wait_for_function("() => (document.querySelector('#tile-plot .js-plotly-plot')?.layout?.annotations || [])"
                               ".some(a => a.text === 'call 0')", timeout=60_000)  # the step-0 charts are drawn
        time.sleep(0.5)
        before = len(chunks)
        started = page.evaluate(PLAY.replace("LAST", str(steps)))  # timed in the page, click to last step shown
        wait_step(page, steps, steps)
        late = (page.evaluate("() => window.__lastStepAt") - started) / 1e3 - steps * PACE
        time.sleep(2.0)  # the last step's charts follow its frame
        result[f"replay_longest_task_ms_{name}"] = round(page.evaluate("() => Math.max(0, ...window.__tasks)"))
        result[f"replay_late_s_{name}"] = round(late, 2)
        result[f"replay_wire_bytes_per_s_{name}"] = round(sum(c[0] for c in chunks[before:]) / (steps * PACE + max(0.0, late)))
        cdp.send("Network.emulateNetworkConditions", link("local"))
    page.close()
    return result


@contextlib.contextmanager
def app_in_chromium() -> Iterator[tuple[object, str]]:
    """`python app.py` (the embedded model) and a chromium to drive it: (browser, the app's URL)."""
    from playwright.sync_api import sync_playwright

    port = free_port()
    proc, _, _ = start_app(port, [])
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path="/usr/bin/chromium",
                                         args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"])
            yield browser, f"http://127.0.0.1:{port}"
            browser.close()
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+")
    p.add_argument("--links", default="local,10,4", help="comma-separated: local, or Mbit/s down (default local,10,4)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    with app_in_chromium() as (browser, url):
        for path in args.runs:
            result = measure_run(browser, url, path, args.links.split(","))
            print(json.dumps(result) if args.json else "\n".join(f"{k:>34}: {v}" for k, v in result.items()) + "\n",
                  flush=True)


if __name__ == "__main__":
    main()
