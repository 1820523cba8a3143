"""`python -m dgemma.bench soak`: the app under steady API traffic for minutes; does it leak or fail?

It launches `python app.py` (or drives a running app, --url) with K clients that call the `generate`
endpoint back to back until the time is up, and reads the serving process's resident memory every few
seconds (docs/reliability.md: the traffic's mix). Reported: calls, requests, errors, p50/p99 call
latency, RSS at start and end, and RSS growth per 10,000 requests after the warm-up (the least-squares
slope of RSS against requests completed, over the samples after the first --warmup share of the time).
"""

from __future__ import annotations

import random
import statistics
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from dgemma.bench import bench_prompts, percentile, print_row
from dgemma.cli import ArgumentParser
from dgemma.errors import first_line
from dgemma.units import MiB
from dgemma.app_process import launch

# Prompts outside the teaching model's task families: a visitor's first try, kept in the mix.
OUTSIDE = ("what is 2+2?", "Hello, who are you?", "add 7+5")
SAMPLE_PERIOD_S = 2.0


def rss_bytes(pid: int | None) -> int | None:
    """Resident memory of process `pid`, or None when it cannot be read (a remote app, a gone process)."""
    if not pid:
        return None
    import psutil

    try:
        return psutil.Process(pid).memory_info().rss
    except psutil.Error:
        return None


class Tally:
    """What every client has done so far (shared by the client threads and the sampler)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls = self.requests = 0
        self.errors: list[str] = []
        self.latencies: list[float] = []
        self.pid: int | None = None

    def record(self, requests: int, latency: float, error: str | None, pid: int | None) -> None:
        with self.lock:
            self.calls += 1
            if error:
                self.errors.append(error)
                return
            self.requests += requests
            self.latencies.append(latency)
            self.pid = self.pid or pid


def _client_loop(url: str, client_index: int, deadline: float, tally: Tally, prompts: list[str]) -> None:
    from gradio_client import Client

    rng = random.Random(client_index)
    client = Client(url, verbose=False)
    while True:  # at least one call, however long connecting took: a soak of zero calls measures nothing
        batch = [rng.choice(prompts) for _ in range(rng.randint(1, 8))]
        settings = {"seed": rng.randrange(1000), "max_new_tokens": rng.choice((16, 32, 64))}
        started = time.monotonic()
        try:
            answer = client.predict(batch, settings, api_name="/generate")
            error = None if len(answer["outputs"]) == len(batch) else f"{len(answer['outputs'])} outputs for {len(batch)} prompts"
            pid = answer.get("pid")
        except Exception as err:  # noqa: BLE001 - a soak records every failure, whatever it is
            error, pid = first_line(err, 200), None
        tally.record(len(batch), time.monotonic() - started, error, pid)
        if time.monotonic() >= deadline:
            return


def drive(url: str, minutes: float, clients: int, warmup: float) -> dict:
    """K clients for `minutes`; RSS sampled every SAMPLE_PERIOD_S against requests completed."""
    prompts = bench_prompts(60) + list(OUTSIDE)
    tally = Tally()
    started = time.monotonic()
    deadline = started + minutes * 60
    samples: list[tuple[float, int, int]] = []  # (seconds, requests, rss)

    def sample() -> None:
        with tally.lock:
            requests, pid = tally.requests, tally.pid
        rss = rss_bytes(pid)
        if rss is not None:
            samples.append((time.monotonic() - started, requests, rss))

    with ThreadPoolExecutor(max_workers=clients) as pool:
        futures = [pool.submit(_client_loop, url, c, deadline, tally, prompts) for c in range(clients)]
        while not all(f.done() for f in futures):
            time.sleep(min(SAMPLE_PERIOD_S, max(0.05, deadline - time.monotonic())))
            sample()
        for f in futures:
            f.result()  # a client that crashed outside a call is a bug in this benchmark: say so
    sample()  # after the last call (a short soak can end before its first sample knew the pid)
    after = [(r, b) for t, r, b in samples if t >= warmup * minutes * 60]
    # RSS against requests completed, least squares; none with fewer than two distinct request counts
    growth = statistics.linear_regression(*zip(*after)).slope if len({r for r, _ in after}) > 1 else None
    return {
        "bench": "soak", "minutes": round((time.monotonic() - started) / 60, 2), "clients": clients,
        "calls": tally.calls, "requests": tally.requests, "errors": len(tally.errors),
        "first_error": tally.errors[0] if tally.errors else None,
        "p50_s": round(percentile(tally.latencies, 0.5), 3) if tally.latencies else None,
        "p99_s": round(percentile(tally.latencies, 0.99), 3) if tally.latencies else None,
        "server_pid": tally.pid,
        "rss_start_mib": round(samples[0][2] / MiB, 1) if samples else None,
        "rss_end_mib": round(samples[-1][2] / MiB, 1) if samples else None,
        "warmup_requests": after[0][0] if after else None,
        "rss_after_warmup_mib": round(after[0][1] / MiB, 1) if after else None,
        "rss_growth_mib_per_10k_requests": round(growth * 10_000 / MiB, 2) if growth is not None else None,
    }


def build_parser() -> ArgumentParser:
    p = ArgumentParser(prog="python -m dgemma.bench soak", description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--url", default=None, help="a running app (default: start one)")
    p.add_argument("--model", default=None, help="checkpoint directory for the started app (default: the embedded model)")
    p.add_argument("--warmup", type=float, default=0.2, help="share of the time before RSS growth is measured")
    p.add_argument("--json", action="store_true")
    return p


def run_soak(minutes: float, clients: int, url: str | None = None, model: str | None = None, warmup: float = 0.2) -> dict:
    """Soak `url`, or an app started for the purpose (stopped afterwards)."""
    if url:
        return drive(url, minutes, clients, warmup)
    with tempfile.TemporaryDirectory() as tmp:
        server = launch(["--model", model] if model else [], Path(tmp) / "bench-soak-app.log")
        try:
            row = drive(server.url, minutes, clients, warmup)
            row["server_alive_after"] = server.process.poll() is None
        finally:
            server.stop()
    return row


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.minutes <= 0 or args.clients < 1 or not 0 <= args.warmup < 1:
        raise ValueError("--minutes must be above 0, --clients at least 1 and --warmup in [0, 1)")
    row = run_soak(args.minutes, args.clients, args.url, args.model, args.warmup)
    print_row(row, args.json, 32)
    return 0 if row["errors"] == 0 and row["requests"] > 0 else 1
