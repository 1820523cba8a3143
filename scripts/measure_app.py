"""Measure the app as a user meets it: seconds to its page, and live updates per second at 32 requests.

    python scripts/measure_app.py [--requests 32] [--browser] [--zerogpu] [--startup-rounds 2] [--startup-only] [--json] [-- app.py flags]

Start-up: a bare Gradio Blocks app (one textbox) and `python app.py` are started alternately,
the same way, and each is timed until GET / answers; the medians and their ratio are printed,
with the seconds until app.py's model is ready (the page is served before it loads), and the
CPU seconds each server had used by its first page (their ratio is steadier on shared cores).
Then app.py (with --zerogpu: under simulated ZeroGPU, tests/zerogpu_sim) is started once more.
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
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from dgemma.ui.generate_tab.controls import client_inputs  # noqa: E402  (the Run endpoint's inputs, in order)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# A bare Gradio Blocks app with one textbox, started the same way: the floor for GET /.
BARE_BLOCKS = """
import os, sys
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
import gradio as gr
with gr.Blocks() as demo:
    gr.Textbox()
demo.launch(server_name="127.0.0.1", server_port=int(sys.argv[1]), quiet=True, prevent_thread_lock=True)
print("bare ready", flush=True)
demo.block_thread()
"""

# ZeroGPU without ZeroGPU: the stubs of tests/test_zerogpu.py (spaces' scheduler client and CUDA move).
SIM = ROOT / "tests" / "zerogpu_sim"


def zerogpu_env(sim_dir: Path) -> dict[str, str]:
    return {"SPACES_ZERO_GPU": "1", "SPACES_ZERO_DEVICE_API_URL": "http://127.0.0.1:9",
            "ZEROGPU_OFFLOAD_DIR": str(sim_dir / "tensors"), "DGEMMA_SIM_DIR": str(sim_dir),
            "PYTHONPATH": os.pathsep.join([str(SIM), os.environ.get("PYTHONPATH", "")])}


def _cpu_seconds(proc: subprocess.Popen) -> float:
    """CPU seconds (user + system, all threads) the process has used so far."""
    import psutil

    times = psutil.Process(proc.pid).cpu_times()
    return times.user + times.system


def _first_page(port: int, proc: subprocess.Popen, t0: float, cpu: list[float] | None = None) -> float:
    """Seconds from start until GET / answers 200, polled every 50 ms; appends the server's CPU
    seconds by then to `cpu` (steadier than wall time when other jobs share the cores)."""
    while True:
        if proc.poll() is not None:
            raise SystemExit(f"the server exited with {proc.returncode} before serving its page")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5) as r:
                if r.status == 200:
                    elapsed = time.monotonic() - t0
                    if cpu is not None:
                        cpu.append(_cpu_seconds(proc))
                    return elapsed
        except OSError:
            pass
        time.sleep(0.05)


def start_app(port: int, extra: list[str], env: dict[str, str] | None = None,
              cpu: list[float] | None = None) -> tuple[subprocess.Popen, float, float]:
    """(process, seconds until GET / answers, seconds until the model is ready)."""
    env = {**os.environ, "GRADIO_ANALYTICS_ENABLED": "False", **(env or {})}
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, str(ROOT / "app.py"), "--port", str(port), *extra], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: [lines.append(line) for line in proc.stdout], daemon=True)
    reader.start()  # keeps the pipe drained
    proc.lines = lines  # the app's log, as it comes
    first_page = _first_page(port, proc, t0, cpu)
    while not any("dgemma app ready" in line for line in lines):
        if proc.poll() is not None:
            raise SystemExit(f"app.py exited with {proc.returncode} before it was ready:\n{''.join(lines)}")
        time.sleep(0.05)
    return proc, first_page, time.monotonic() - t0


def bare_first_page(port: int, cpu: list[float] | None = None) -> float:
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-c", BARE_BLOCKS, str(port)], cwd=ROOT,
                            env={**os.environ, "GRADIO_ANALYTICS_ENABLED": "False"},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        return _first_page(port, proc, t0, cpu)
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def measure_startup(rounds: int, extra: list[str]) -> dict:
    """GET / of `python app.py` against a bare Blocks app, alternating, `rounds` each; medians."""
    bare, app, ready, bare_cpu, app_cpu = [], [], [], [], []
    for _ in range(rounds):
        bare.append(bare_first_page(free_port(), bare_cpu))
        proc, first_page, model_ready = start_app(free_port(), extra, cpu=app_cpu)
        proc.terminate()
        proc.wait(timeout=20)
        app.append(first_page)
        ready.append(model_ready)
    b, a = statistics.median(bare), statistics.median(app)
    bc, ac = statistics.median(bare_cpu), statistics.median(app_cpu)
    return {"bare_blocks_first_page_s": round(b, 2), "app_first_page_s": round(a, 2),
            "app_over_bare": round(a / b, 2), "app_model_ready_s": round(statistics.median(ready), 2),
            "startup_rounds": rounds, "bare_rounds_s": [round(x, 2) for x in bare],
            "app_rounds_s": [round(x, 2) for x in app], "bare_first_page_cpu_s": round(bc, 2),
            "app_first_page_cpu_s": round(ac, 2), "app_over_bare_cpu": round(ac / bc, 2)}


def measure_stream(url: str, requests: int, max_new_tokens: int, max_denoising_steps: int = 48) -> dict:
    from gradio_client import Client

    url = url.rstrip("/")  # the page is GET url + "/" (a second slash is Gradio's 404)
    client = Client(url, verbose=False)
    prompts = "add 12+34\nreverse hello\ncount 5 to 12\nstory: big cat, park"
    latencies: list[float] = []
    stop = threading.Event()

    def probe():  # at least once, however short the run
        while True:
            t = time.monotonic()
            urllib.request.urlopen(url + "/", timeout=30).read()
            latencies.append(time.monotonic() - t)
            if stop.wait(0.5):
                return

    prober = threading.Thread(target=probe, daemon=True)
    job = client.submit(*client_inputs(prompts, requests, max_new_tokens=max_new_tokens, max_denoising_steps=max_denoising_steps),
                        api_name="/generate_stream")
    t0 = time.monotonic()
    prober.start()
    stamps = []
    first_canvas = None
    for frame in job:
        stamps.append(time.monotonic() - t0)
        if first_canvas is None and any(w in str(frame[3]) for w in ("running", "converged", "done")):
            first_canvas = stamps[-1]  # the first frame with a request denoising: its canvas is on the page
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
        "click_to_first_canvas_s": round(first_canvas, 2) if first_canvas is not None else None,
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
    p.add_argument("--startup-rounds", type=int, default=2,
                   help="start a bare Blocks app and app.py this many times each, alternating (0: skip)")
    p.add_argument("--startup-only", action="store_true", help="measure start-up only (no stream afterwards)")
    p.add_argument("--zerogpu", action="store_true",
                   help="run the stream through simulated ZeroGPU (spaces' real wrappers, stubbed scheduler)")
    p.add_argument("app_args", nargs="*", help="extra flags for app.py (after --)")
    args = p.parse_args()
    result = measure_startup(args.startup_rounds, args.app_args) if args.startup_rounds > 0 else {}
    if args.startup_only:
        print(json.dumps(result) if args.json else "\n".join(f"{k:>26}: {v}" for k, v in result.items()))
        return
    port = free_port()
    with tempfile.TemporaryDirectory() as sim_dir:
        env = zerogpu_env(Path(sim_dir)) if args.zerogpu else None
        proc, first_page_s, ready_s = start_app(port, args.app_args, env)
        try:
            stream = measure_stream(f"http://127.0.0.1:{port}", args.requests, args.max_new_tokens)
            if args.browser:
                stream.update(measure_browser(f"http://127.0.0.1:{port}", args.requests))
        finally:
            proc.terminate()
            proc.wait(timeout=20)
    result.update({"mode": "zerogpu (simulated)" if args.zerogpu else "local", "first_page_s": round(first_page_s, 2),
                   "model_ready_s": round(ready_s, 2), **stream})
    print(json.dumps(result) if args.json else "\n".join(f"{k:>26}: {v}" for k, v in result.items()))


if __name__ == "__main__":
    main()
