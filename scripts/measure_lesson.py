"""Measure the lesson tab's live view in chromium: bytes on the wire per frame and per second, and
the main thread's milliseconds to draw a frame, while the lesson's runs go.

    python scripts/measure_lesson.py [--requests 32] [--steps 3] [--no-real-scale] [--json] [-- app.py flags]

Starts `python app.py` (the embedded model unless app flags say otherwise), opens the lesson tab,
sets the batch, ticks *real scale* (logits padded to vocab 262,144) and presses Run. Meanwhile the
page's event stream is watched as tests/test_real_scale.py does (Chrome DevTools Protocol, every
chunk of /queue/data: encoded bytes on the wire and decoded), and the overview's own count of the
frames it drew and the milliseconds the last one took (its `data-frames`, `data-apply-ms`).
A chunk is one message of the stream (a frame of the view, a result card, the tile chart).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parent.parent)]
from measure_app import free_port, start_app  # noqa: E402

PROBE = """() => {
  window.__apply = [];
  const root = document.querySelector('#lesson-board .dgv');
  new MutationObserver(() => window.__apply.push(+root.dataset.applyMs))
    .observe(root, {attributes: true, attributeFilter: ['data-frames']});
}"""


def measure(url: str, requests: int, steps: int, real: bool) -> dict:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium",
                                    args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"])
        page = browser.new_page(viewport={"width": 1360, "height": 1000})
        cdp = page.context.new_cdp_session(page)
        cdp.send("Network.enable")
        urls: dict[str, str] = {}
        chunks: list[tuple[int, int]] = []
        cdp.on("Network.requestWillBeSent", lambda e: urls.__setitem__(e["requestId"], e["request"]["url"]))
        cdp.on("Network.dataReceived", lambda e: chunks.append((e["encodedDataLength"], e["dataLength"]))
               if "/queue/data" in urls.get(e["requestId"], "") else None)
        page.goto(url, wait_until="load")
        page.wait_for_selector("#status", timeout=120_000)
        page.wait_for_function("() => document.querySelector('#status').innerText.includes('Idle.')", timeout=120_000)
        page.get_by_role("tab", name="Tiling vs OOM").click()
        for elem_id, value in (("lesson-requests", requests), ("lesson-denoising-steps", steps)):
            box = page.locator(f"#{elem_id} input[type=number]")
            box.fill(str(value))
            box.press("Enter")
        if real:
            page.locator("#lesson-real-scale input").check()
        page.wait_for_timeout(1000)  # the budget suggested for this batch and scale
        page.evaluate(PROBE)
        chunks.clear()
        started = time.monotonic()
        page.click("#lesson-run")
        page.wait_for_selector("#lesson-verdict [data-outcome]", timeout=3_600_000)
        seconds = time.monotonic() - started
        page.wait_for_timeout(1000)
        applied = [ms for ms in page.evaluate("() => window.__apply") if ms == ms]
        cells = page.evaluate("() => { const c = document.querySelector('#lesson-board canvas'); return [c.dataset.rows, c.dataset.cols]; }")
        browser.close()
    wire = [c[0] for c in chunks]
    return {
        "requests": int(cells[0]), "canvas": int(cells[1]), "real_scale": real, "run_seconds": round(seconds, 1),
        "frames_drawn": len(applied), "chunks": len(chunks), "wire_bytes_max": max(wire, default=0),
        "wire_bytes_median": statistics.median(wire) if wire else 0,
        "decoded_bytes_max": max((c[1] for c in chunks), default=0),
        "wire_bytes_per_s": round(sum(wire) / seconds), "apply_ms_median": round(statistics.median(applied), 1) if applied else None,
        "apply_ms_max": round(max(applied), 1) if applied else None,
    }  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=32)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--no-real-scale", action="store_true")
    p.add_argument("--json", action="store_true")
    p.add_argument("app_args", nargs="*", help="extra flags for app.py (after --)")
    args = p.parse_args()
    port = free_port()
    proc, _, _ = start_app(port, args.app_args)
    try:
        result = measure(f"http://127.0.0.1:{port}", args.requests, args.steps, not args.no_real_scale)
    finally:
        proc.terminate()
        proc.wait(timeout=20)
    print(json.dumps(result) if args.json else "\n".join(f"{k:>22}: {v}" for k, v in result.items()))


if __name__ == "__main__":
    main()
