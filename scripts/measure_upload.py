"""Measure loading a run file over a visitor's link: what the page says while it uploads, and when.

    python scripts/measure_upload.py RUN.jsonl [RUN.jsonl ...] [--down 4] [--up 2] [--latency 40] [--json]

Starts `python app.py` (the embedded model; a replay needs none), opens the page in chromium with
the link emulated through the Chrome DevTools Protocol (Mbit/s down and up, ms of latency), loads
each run with "Load a run", and keeps, in the page, every text the upload note shows with its time
(a MutationObserver), until the run is shown. Prints the file's size, the seconds the upload took
against the link's own floor (size / uplink), how many times the note changed while uploading and
the longest it stayed the same, its first and last percentages, the seconds from the upload's
end to the run shown (reading it), and a few of the notes with their times.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parent.parent)]
from measure_view import app_in_chromium  # noqa: E402

KEEP_NOTES = """() => { window.notes = [];
  const note = document.querySelector('.upload-note');
  new MutationObserver(() => window.notes.push([performance.now(), note.textContent]))
    .observe(note, {childList: true, characterData: true, subtree: true});
  new MutationObserver(() => { if (/Replay of the run: step 0 of/.test(document.querySelector('#status').innerText))
    window.shownAt ??= performance.now(); }).observe(document.querySelector('#status'),
    {childList: true, characterData: true, subtree: true});
  window.shownAt = undefined; }"""
SHARE = re.compile(r"\((\d+) %\)$")


def sample(notes: list, count: int = 8) -> list:
    """About `count` of the notes, evenly spread, and the last two."""
    every = max(1, len(notes) // count)
    return [n for i, n in enumerate(notes) if i % every == 0 or i >= len(notes) - 2]


def measure(browser, url: str, path: str, down: float, up: float, latency: float) -> dict:
    page = browser.new_page(viewport={"width": 1360, "height": 1000})
    try:
        page.goto(url, wait_until="load")
        page.wait_for_function("() => document.querySelector('#status')?.innerText.includes('Idle.')", timeout=120_000)
        cdp = page.context.new_cdp_session(page)
        cdp.send("Network.enable")
        cdp.send("Network.emulateNetworkConditions", {"offline": False, "latency": latency,
                                                      "downloadThroughput": down * 1e6 / 8, "uploadThroughput": up * 1e6 / 8})
        page.evaluate(KEEP_NOTES)
        with page.expect_file_chooser() as chooser:
            page.click("#load-run")
        chosen = page.evaluate("() => performance.now()")
        chooser.value.set_files(path)
        page.wait_for_function("() => window.shownAt !== undefined && window.notes.length && window.notes.at(-1)[1] === ''",
                               timeout=600_000)
        notes, shown = page.evaluate("() => [window.notes, window.shownAt]")
    finally:
        page.close()
    size = Path(path).stat().st_size
    uploading = [(t, text) for t, text in notes if text.startswith("Uploading")]
    uploaded = next(t for t, text in notes if text.startswith("Uploaded"))
    shares = [int(SHARE.search(text)[1]) for _, text in uploading]
    times = [t for t, _ in uploading] + [uploaded]
    return {
        "run": Path(path).name, "file_bytes": size, "link": f"{down:g} Mbit/s down, {up:g} up, {latency:g} ms",
        "upload_s": round((uploaded - chosen) / 1e3, 2), "uplink_floor_s": round(size * 8 / (up * 1e6), 2),
        "notes_while_uploading": len(uploading), "longest_same_note_s": round(max(b - a for a, b in zip(times, times[1:])) / 1e3, 2),
        "first_share_pct": shares[0], "last_share_pct": shares[-1],
        "first_note_after_s": round((uploading[0][0] - chosen) / 1e3, 2),
        "read_and_shown_s": round((shown - uploaded) / 1e3, 2), "total_s": round((shown - chosen) / 1e3, 2),
        "notes": [f"{(t - chosen) / 1e3:.1f} s: {text or '(empty)'}" for t, text in sample(notes)],
    }  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+")
    p.add_argument("--down", type=float, default=4.0, help="Mbit/s down (default 4)")
    p.add_argument("--up", type=float, default=2.0, help="Mbit/s up (default 2)")
    p.add_argument("--latency", type=float, default=40.0, help="ms (default 40)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    with app_in_chromium() as (browser, url):
        for path in args.runs:
            result = measure(browser, url, path, args.down, args.up, args.latency)
            print(json.dumps(result) if args.json else "\n".join(f"{k:>24}: {v}" for k, v in result.items()) + "\n",
                  flush=True)

if __name__ == "__main__":
    main()
