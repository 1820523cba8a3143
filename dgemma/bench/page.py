"""`python -m dgemma.bench page`: how soon a fresh page of a loaded server can be used, beside a bare
Gradio app's.

It launches `python app.py` and a bare Gradio app with one button, and opens fresh pages of each in
chromium, alternately, after one unmeasured visit each (a returning visitor's cache). Per page: the
milliseconds from navigation until Run is enabled ("Idle." on our status line), timed in the page, and
its main thread's CPU milliseconds until then (Chrome's trace: a busy machine stretches them less than
wall time). Idle, then while another tab runs `--requests` requests. Printed: the medians and their
ratios, idle and loaded.
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

from dgemma.app_process import free_port, launch
from dgemma.bench import bench_prompts, print_row
from dgemma.cli import ArgumentParser, positive_int

CHROMIUM = "/usr/bin/chromium"
# Installed before the page's scripts: the time its Run is first enabled (and, on ours, the model's line shown).
WATCH = """(ours) => {
  const seen = () => {
    const run = document.querySelector('#run'), status = document.querySelector('#status');
    if (window.usableAt === undefined && run && !run.disabled && (!ours || status?.textContent.includes('Idle.')))
      window.usableAt = performance.now();
  };
  new MutationObserver(seen).observe(document, {subtree: true, childList: true, attributes: true, characterData: true});
}"""
# Chrome's trace categories for the main thread's tasks (with their thread time) and the navigation's start.
TRACED = ["toplevel", "devtools.timeline", "disabled-by-default-devtools.timeline", "blink.user_timing"]


def main_thread_cpu_ms(events: list[dict], url: str, until_ms: float) -> float:
    """CPU milliseconds of the main thread of the page navigated to `url`, in the tasks it began within
    `until_ms` of that navigation, from a Chrome trace's events."""
    nav = next(e for e in events if e.get("name") == "navigationStart"
               and e["args"]["data"].get("documentLoaderURL", "").startswith(url))
    main, start = (nav["pid"], nav["tid"]), nav["ts"]
    return sum(e.get("tdur", 0) for e in events if e.get("name") == "RunTask" and (e["pid"], e["tid"]) == main
               and start <= e["ts"] <= start + until_ms * 1000) / 1000


def usable_ms(context, url: str, ours: bool) -> tuple[float, float]:
    """Milliseconds from navigating a fresh page to `url` until its Run is enabled (ours: and "Idle."), and
    the main thread's CPU milliseconds until then."""
    page = context.new_page()
    try:
        context.browser.start_tracing(page=page, categories=TRACED)
        page.add_init_script(f"({WATCH})({'true' if ours else 'false'})")
        page.goto(url, wait_until="commit")
        page.wait_for_function("() => window.usableAt !== undefined", timeout=120_000, polling=50)
        usable = page.evaluate("() => window.usableAt")
        return usable, main_thread_cpu_ms(json.loads(context.browser.stop_tracing())["traceEvents"], url, usable)
    finally:
        page.close()


def keep_running(loader) -> None:
    """The loading tab's run goes on: Run again once the last has ended (its status line no longer counts calls)."""
    if "sampler calls" not in (loader.text_content("#status") or ""):
        loader.click("#run")
        loader.wait_for_function("() => document.querySelector('#status').textContent.includes('sampler calls')",
                                 timeout=120_000)


def loading_tab(context, url: str, requests: int):
    """A tab of the app running `requests` requests (up to the prompts box's and the batch's limits)."""
    loader = context.new_page()
    loader.goto(url)
    loader.wait_for_selector("#run:not([disabled])", timeout=120_000)
    loader.locator("#prompts textarea").fill("\n".join(bench_prompts(requests)))
    box = loader.locator("#concurrent input[type=number]")
    box.fill(str(requests))
    box.press("Enter")
    keep_running(loader)
    return loader


def measure(context, app: str, bare: str, rounds: int, loader=None) -> dict:
    ours, floor = [], []
    usable_ms(context, app, True), usable_ms(context, bare, False)  # the browser's cache filled, as a visitor's is
    for _ in range(rounds):
        for times, url, is_ours in ((ours, app, True), (floor, bare, False)):
            if loader is not None:
                keep_running(loader)
            times.append(usable_ms(context, url, is_ours))
    (o, o_cpu), (b, b_cpu) = ([statistics.median(t) for t in zip(*times)] for times in (ours, floor))
    return {"app_ms": round(o), "bare_ms": round(b), "ratio": round(o / b, 2),
            "app_cpu_ms": round(o_cpu), "bare_cpu_ms": round(b_cpu), "cpu_ratio": round(o_cpu / b_cpu, 2)}


def main(argv: list[str] | None = None) -> int:
    p = ArgumentParser(prog="python -m dgemma.bench page", description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=positive_int, default=7, help="fresh pages of each app, alternately (default 7)")
    p.add_argument("--requests", type=positive_int, default=32, help="requests the other tab runs (default 32)")
    p.add_argument("--model", default=None, help="app.py's --model (default: the embedded model)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    from playwright.sync_api import sync_playwright

    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    import gradio as gr

    with gr.Blocks() as bare:  # a bare Gradio app with one button, served from here: the floor for a page's first use
        gr.Button("Run", elem_id="run")
    with tempfile.TemporaryDirectory() as tmp:
        server = launch(["--model", args.model] if args.model else [], Path(tmp) / "app.log", timeout=300)
        bare.launch(server_name="127.0.0.1", server_port=free_port(), prevent_thread_lock=True, quiet=True)
        try:
            with sync_playwright() as pw:
                browser = pw.chromium.launch(executable_path=CHROMIUM,
                                             args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"])
                context = browser.new_context(viewport={"width": 1366, "height": 768})
                bare_url = bare.local_url.rstrip("/")
                idle = measure(context, server.url, bare_url, args.rounds)
                loader = loading_tab(context, server.url, args.requests)
                loaded = measure(context, server.url, bare_url, args.rounds, loader)
                browser.close()
        finally:
            with contextlib.redirect_stdout(sys.stderr):  # Gradio says it closed; stdout is the row's
                bare.close()
            server.stop()
    row = {**{f"idle_{k}": v for k, v in idle.items()}, **{f"loaded_{k}": v for k, v in loaded.items()},
           "rounds": args.rounds, "other_tab_requests": args.requests}
    print_row(row, args.json, 20)
    return 0
