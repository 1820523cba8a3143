"""`python -m dgemma.bench hostile`: a public app's disk and memory under visitors who mean harm.

It launches `python app.py` with a small disk cap and a short file age, then, all at once, sends
oversized, undeclared and junk uploads, API calls with `record: true`, and browser tabs that run and
close, while an ordinary visitor's tab runs, downloads its run file and loads it (docs/reliability.md).
Printed: disk and RSS before, the most during, after the attack and once the age has passed; how long
disk took to return to its baseline; every outcome by kind; the ordinary visitor's result. Exit status
0 when disk stayed under the cap, went back to its baseline, nothing oversized was stored, and the
ordinary visitor's run completed.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from dgemma.bench import print_row, timed
from dgemma.bench.soak import rss_bytes
from dgemma.cli import ArgumentParser, positive_int, size_arg
from dgemma.errors import first_line
from dgemma.units import MiB
from dgemma.app_process import launch

SAMPLE_PERIOD_S = 0.25
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
DOWNLOAD_READY = "() => document.querySelector('#download-run') && !document.querySelector('#download-run').disabled"


def disk_bytes(folder: Path) -> int:
    """Bytes of every file under `folder` (the app's directory for visitors' files)."""
    total = 0
    for root, _, names in os.walk(folder):
        for name in names:
            with contextlib.suppress(OSError):  # removed meanwhile
                total += os.stat(os.path.join(root, name)).st_size
    return total


def upload(url: str, size: int, declare: bool = True) -> str:
    """POST a multipart upload of `size` junk bytes, streamed (never held here); the outcome in a word."""
    import httpx

    boundary = "dgemmahostile"
    head = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"files\"; filename=\"junk.jsonl\"\r\n"
            "Content-Type: application/octet-stream\r\n\r\n").encode()
    tail = f"\r\n--{boundary}--\r\n".encode()

    def body():
        yield head
        left = size
        while left > 0:
            yield b"x" * min(MiB, left)
            left -= MiB
        yield tail

    headers = {"content-type": f"multipart/form-data; boundary={boundary}"}
    if declare:
        headers["content-length"] = str(len(head) + size + len(tail))
    try:
        response = httpx.post(f"{url}/gradio_api/upload", content=body(), headers=headers, timeout=120)
        return f"http {response.status_code}"
    except httpx.HTTPError as err:  # the server closed the connection on a refused upload
        return f"closed ({type(err).__name__})"


def api_recording(url: str, index: int) -> str:
    from gradio_client import Client

    try:
        answer = Client(url, verbose=False).predict(["add 12+34", "reverse hello"] * 4, {"seed": index, "record": True},
                                                    api_name="/generate")
        return "recorded" if answer.get("recording", "").startswith('{"format": "dgemma-run"') else "no recording"
    except Exception as err:  # noqa: BLE001 - every outcome is reported
        return f"error: {first_line(err, 120)}"


def tab_runs(browser, url: str, download_to: Path | None = None) -> str:
    """One tab: open, Run, wait for the run's file, (download it and load it), close."""
    page = browser.new_page()
    try:
        page.goto(url, wait_until="load")
        page.wait_for_selector("#run:not([disabled])", timeout=120_000)
        page.click("#run")
        page.wait_for_function(DOWNLOAD_READY, timeout=180_000)
        if download_to is None:
            return "ran"
        with page.expect_download() as download:
            page.click("#download-run")
        download.value.save_as(download_to)
        from dgemma.recording import load_file

        return f"ran, its file loads ({load_file(str(download_to)).steps} steps)"
    except Exception as err:  # noqa: BLE001
        return f"error: {first_line(err, 120)}"
    finally:
        page.close()


def browse(url: str, tabs: int, at_once: int, ordinary: Path, results: Counter, visitor: dict) -> None:
    """The tabs, `at_once` at a time (each in a thread of one browser), and the ordinary visitor's tab."""
    from playwright.sync_api import sync_playwright

    def worker(count: int, first: bool) -> None:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM,
                                        args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"])
            if first:
                visitor["result"], seconds = timed(tab_runs, browser, url, ordinary)
                visitor["seconds"] = round(seconds, 1)
            for _ in range(count):
                results[tab_runs(browser, url).split(":")[0]] += 1
            browser.close()

    with ThreadPoolExecutor(max_workers=at_once) as pool:
        shares = [tabs // at_once + (i < tabs % at_once) for i in range(at_once)]
        for future in [pool.submit(worker, n, i == 0) for i, n in enumerate(shares)]:
            future.result()


def attack(url: str, args, cap: int) -> dict:
    outcomes: dict[str, Counter] = {"oversized": Counter(), "undeclared": Counter(), "junk": Counter(),
                                    "api record": Counter(), "tabs": Counter()}
    visitor: dict = {}
    largest = min(256 * MiB, cap)
    with ThreadPoolExecutor(max_workers=args.concurrency) as pool:
        jobs = [("oversized", pool.submit(upload, url, largest + 2 * MiB)) for _ in range(args.oversized)]
        jobs += [("undeclared", pool.submit(upload, url, MiB, False)) for _ in range(max(1, args.oversized // 8))]
        jobs += [("junk", pool.submit(upload, url, largest // 4)) for _ in range(args.junk)]
        jobs += [("api record", pool.submit(api_recording, url, i)) for i in range(args.api_calls)]
        with tempfile.TemporaryDirectory() as tmp:
            browse(url, args.tabs, args.tabs_at_once, Path(tmp) / "ordinary.jsonl", outcomes["tabs"], visitor)
        for kind, job in jobs:
            outcomes[kind][job.result().split(":")[0]] += 1
    return {"outcomes": {k: dict(v) for k, v in outcomes.items()}, "ordinary_visitor": visitor}


def sampler(folder: Path, pid: int, samples: list, stop: threading.Event) -> None:
    while not stop.is_set():
        samples.append((time.monotonic(), disk_bytes(folder), rss_bytes(pid) or 0))
        stop.wait(SAMPLE_PERIOD_S)


def run_hostile(args) -> dict:
    cap = args.max_disk
    with tempfile.TemporaryDirectory() as tmp:
        parent = Path(tmp) / "files"
        server = launch(["--max-disk", str(cap), "--files-max-age", str(args.age),
                         *(["--model", args.model] if args.model else [])], Path(tmp) / "app.log",
                        env={"GRADIO_TEMP_DIR": str(parent)})
        folder = parent / f"dgemma-files-{server.process.pid}"
        samples: list[tuple[float, int, int]] = []
        stop = threading.Event()
        watcher = threading.Thread(target=sampler, args=(folder, server.process.pid, samples, stop), daemon=True)
        try:
            time.sleep(1.0)
            before = (disk_bytes(folder), rss_bytes(server.process.pid) or 0)
            watcher.start()
            started = time.monotonic()
            row = attack(server.url, args, cap)
            ended = time.monotonic()
            after_attack = samples[-1]
            back = None
            while time.monotonic() - ended < args.age + 30:  # the age, two sweeps and a tab's unload
                if disk_bytes(folder) <= before[0]:
                    back = time.monotonic() - ended
                    break
                time.sleep(SAMPLE_PERIOD_S)
            time.sleep(2 * SAMPLE_PERIOD_S)
            alive = server.process.poll() is None
        finally:
            stop.set()
            server.stop()
    during = [s for s in samples if started <= s[0] <= ended]
    peak = max(during, key=lambda s: s[1])
    back_after_peak = next((t - peak[0] for t, disk, _ in samples if t > peak[0] and disk <= before[0]), None)
    return {
        "bench": "hostile", "max_disk_mib": round(cap / MiB, 1), "files_max_age_s": args.age,
        "attack_s": round(ended - started, 1),
        "disk_mib": {"before": round(before[0] / MiB, 2), "most_during": round(max(s[1] for s in during) / MiB, 2),
                     "after_attack": round(after_attack[1] / MiB, 2), "after_age": round(samples[-1][1] / MiB, 2)},
        "disk_back_to_baseline_s_after_attack": round(back, 1) if back is not None else None,
        "disk_peak_at_s": round(peak[0] - started, 1),
        "disk_back_to_baseline_s_after_peak": round(back_after_peak, 1) if back_after_peak is not None else None,
        "rss_mib": {"before": round(before[1] / MiB, 1), "most_during": round(max(s[2] for s in during) / MiB, 1),
                    "after_attack": round(after_attack[2] / MiB, 1), "after_age": round(samples[-1][2] / MiB, 1)},
        **row, "server_alive_after": alive,
    }  # fmt: skip


def build_parser() -> ArgumentParser:
    p = ArgumentParser(prog="python -m dgemma.bench hostile", description=__doc__.split("\n\n")[0])
    p.add_argument("--max-disk", type=size_arg, default="256MiB", help="the app's --max-disk (default 256MiB)")
    p.add_argument("--age", type=positive_int, default=20, help="the app's --files-max-age in seconds (default 20)")
    p.add_argument("--oversized", type=int, default=40, help="uploads declaring more than a run file can be")
    p.add_argument("--junk", type=int, default=24, help="uploads of junk, a quarter of the disk cap each")
    p.add_argument("--api-calls", type=int, default=32, help="API calls with record: true")
    p.add_argument("--tabs", type=int, default=8, help="browser tabs that run and close")
    p.add_argument("--tabs-at-once", type=positive_int, default=2)
    p.add_argument("--concurrency", type=positive_int, default=16, help="uploads and API calls under way at once")
    p.add_argument("--model", default=None)
    p.add_argument("--json", action="store_true")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    row = run_hostile(args)
    print_row(row, args.json, 38)
    stored = row["outcomes"]["oversized"].get("http 200", 0)
    ok = (row["disk_mib"]["most_during"] <= row["max_disk_mib"] and row["disk_back_to_baseline_s_after_attack"] is not None
          and not stored and row["ordinary_visitor"].get("result", "").startswith("ran"))
    return 0 if ok else 1
