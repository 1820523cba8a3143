"""`python -m dgemma.bench load`: the app under many concurrent API clients, checked against the CLI.

It launches `python app.py` (the embedded model unless --model), then N clients at once each call
the `generate` endpoint with their own prompts (client c asks for prompts 2c, 2c+1, ... with seed
2c, so prompt i has seed i), as a classroom of tabs or a Space's visitors would. Every request must
complete exactly once and give the tokens `python -m dgemma.generate --seed 0` gives for the same
prompts. Reported: completed, errors, equal to the CLI, p50/p95 latency, requests per second.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from dgemma.bench import bench_prompts, percentile, print_row
from dgemma.cli import ArgumentParser, positive_int
from dgemma.errors import first_line
from dgemma.app_process import launch


def cli_texts(prompts: list[str], max_new_tokens: int, model: str | None) -> list[str]:
    """The seeded CLI's outputs for `prompts` (prompt i gets seed i): the load test's oracle."""
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write("\n".join(prompts) + "\n")
    cmd = [sys.executable, "-m", "dgemma.generate", "--prompts-file", f.name, "--seed", "0",
           "--max-new-tokens", str(max_new_tokens), "--max-num-seqs", "32", "--json"]  # fmt: skip
    if model:
        cmd += ["--model", model]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"dgemma.generate failed: {out.stderr.strip()}")
    rows = [json.loads(line) for line in out.stdout.splitlines()]
    return [row["text"] for row in rows if "summary" not in row]


def drive(url: str, prompts: list[str], per_client: int, max_new_tokens: int, timeout_s: float) -> dict:
    """All clients at once; returns what each got back, its latency, and any error."""
    from gradio_client import Client

    clients = len(prompts) // per_client
    results: list[dict | None] = [None] * clients
    gate = threading.Barrier(clients)

    def one(c: int) -> None:
        mine = prompts[c * per_client : (c + 1) * per_client]
        client = Client(url, verbose=False)
        gate.wait(timeout=timeout_s)  # every client connected: now they all ask at once
        started = time.monotonic()
        try:
            job = client.submit(mine, {"seed": c * per_client, "max_new_tokens": max_new_tokens}, api_name="/generate")
            answer = job.result(timeout=timeout_s)
            results[c] = {"outputs": answer["outputs"], "latency": time.monotonic() - started, "error": None}
        except Exception as err:  # noqa: BLE001 - a load test records every failure, whatever it is
            results[c] = {"outputs": [], "latency": time.monotonic() - started, "error": first_line(err, 200)}

    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=clients) as pool:
        list(pool.map(one, range(clients)))
    return {"results": results, "wall_s": time.monotonic() - started}


def score(prompts: list[str], expected: list[str], per_client: int, run: dict) -> dict:
    completed = equal = 0
    errors = []
    seen: dict[int, int] = {}
    for c, result in enumerate(run["results"]):
        if result is None or result["error"]:
            errors.append(result["error"] if result else "no result")
            continue
        for k, out in enumerate(result["outputs"]):
            i = c * per_client + k
            seen[i] = seen.get(i, 0) + 1
            completed += out["prompt"] == prompts[i] and out["seed"] == i
            equal += out["text"] == expected[i]
    latencies = [r["latency"] for r in run["results"] if r and not r["error"]]
    return {
        "bench": "load", "clients": len(run["results"]), "requests": len(prompts), "completed": completed,
        "completed_exactly_once": sum(1 for i in range(len(prompts)) if seen.get(i) == 1), "equal_to_cli": equal,
        "errors": len(errors), "first_error": errors[0] if errors else None,
        "p50_s": round(percentile(latencies, 0.5), 3) if latencies else None,
        "p95_s": round(percentile(latencies, 0.95), 3) if latencies else None,
        "wall_s": round(run["wall_s"], 3), "requests_per_s": round(completed / run["wall_s"], 3),
    }  # fmt: skip


def build_parser() -> ArgumentParser:
    p = ArgumentParser(prog="python -m dgemma.bench load", description=__doc__.split("\n\n")[0])
    p.add_argument("--clients", type=positive_int, default=64)
    p.add_argument("--prompts-per-client", type=positive_int, default=2)
    p.add_argument("--max-new-tokens", type=positive_int, default=32)
    p.add_argument("--model", default=None, help="checkpoint directory (default: the embedded model)")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds a client waits for its answer")
    p.add_argument("--json", action="store_true")
    return p


def run_load(clients: int, per_client: int, max_new_tokens: int, model: str | None, timeout_s: float, log_dir: Path) -> dict:
    prompts = bench_prompts(clients * per_client)
    expected = cli_texts(prompts, max_new_tokens, model)
    args = ["--max-queued", str(max(64, per_client)), "--max-prompts", str(max(64, per_client))]
    if model:
        args += ["--model", model]
    server = launch(args, log_dir / "bench-load-app.log")
    try:
        run = drive(server.url, prompts, per_client, max_new_tokens, timeout_s)
        alive = server.process.poll() is None
    finally:
        server.stop()
    row = score(prompts, expected, per_client, run)
    row["server_alive_after"] = alive
    row["startup_s"] = round(server.startup_s, 2)
    return row


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        row = run_load(args.clients, args.prompts_per_client, args.max_new_tokens, args.model, args.timeout, Path(tmp))
    print_row(row, args.json, 24)
    ok = row["completed_exactly_once"] == row["requests"] and row["equal_to_cli"] == row["requests"]
    return 0 if ok else 1
