"""`python -m dgemma.bench engine`: the engine against transformers' own `generate()`, side by side.

(a) batch: the same prompts, same sampling settings, all at once — engine canvas-tokens/s vs one
    `model.generate()` call on the whole (left-padded) batch;
(b) staggered: requests arriving at Poisson times — the engine (continuous batching) vs a server
    that runs `generate()` on one request at a time, first come first served. Throughput ratio
    and the engine's p50/p95 latency (arrival to final event); the baseline's are printed too.

Each side's figure is its best of a few runs interleaved with the other's (the CPU is shared); canvas
tokens are counted alike on both sides, up to each request's EOS (docs/benchmarks.md: how it is measured).
"""

from __future__ import annotations

import itertools
import math
import random
import time

import torch

from dgemma.events import Status
from dgemma.bench import bench_prompts, percentile, print_row, timed
from dgemma.cli import ArgumentParser, positive_int


def parse_args(argv: list[str] | None):
    p = ArgumentParser(prog="python -m dgemma.bench engine", description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="checkpoint (default: the embedded model)")
    p.add_argument("--load-format", default="auto", choices=["auto", "dummy"],
                   help="dummy: random weights of --model's config, built on the device")
    p.add_argument("--requests", type=positive_int, default=32, help="prompts in the batch bench (default 32)")
    p.add_argument("--staggered", type=int, default=64, help="requests in the staggered bench (default 64; 0 skips)")
    p.add_argument("--max-num-seqs", type=positive_int, default=32, help="engine slots (default 32)")
    p.add_argument("--max-new-tokens", type=int, default=None, help="default: the model's generation config")
    p.add_argument("--max-denoising-steps", type=int, default=None, help="default: the model's generation config")
    p.add_argument("--load", type=float, default=8.0,
                   help="staggered arrival rate as a multiple of one-at-a-time generate()'s service rate (default 8: both sides saturated)")
    p.add_argument("--repeat", type=positive_int, default=3, help="batch bench: best of N interleaved runs per side (default 3)")
    p.add_argument("--staggered-repeat", type=positive_int, default=2, help="staggered bench: best of N per side (default 2)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    p.add_argument("--only", choices=["batch", "staggered"], default=None)
    p.add_argument("--json", action="store_true", help="one JSON object per bench")
    args = p.parse_args(argv)
    if args.staggered < 0 or args.load <= 0:
        p.error("--staggered must be >= 0 and --load > 0")
    return args


class Baseline:
    """transformers' `model.generate()` on an untouched model, counting canvases like the engine."""

    def __init__(self, loaded, settings: dict, max_new_tokens: int):
        self.loaded, self.settings, self.max_new_tokens = loaded, settings, max_new_tokens
        self.eos = set(loaded.eos_token_ids)

    def run(self, prompts: list[str]) -> int:
        """Generate for `prompts` in one batch; returns the canvases that count."""
        tok, cl = self.loaded.tokenizer, self.loaded.canvas_length
        ids = [self.loaded.encode(p) for p in prompts]
        width = max(map(len, ids))
        pad = tok.pad_token_id or 0
        input_ids = torch.tensor([[pad] * (width - len(i)) + i for i in ids])  # left padding
        mask = torch.tensor([[0] * (width - len(i)) + [1] * len(i) for i in ids])
        out = self.loaded.model.generate(input_ids.to(self.loaded.device), attention_mask=mask.to(self.loaded.device),
                                         max_new_tokens=self.max_new_tokens, **self.settings)
        new = out.sequences[:, width:].tolist()
        canvases = 0
        for row in new:
            eos = next((j for j, t in enumerate(row) if t in self.eos), None)
            canvases += (eos // cl + 1) if eos is not None else math.ceil(len(row) / cl)
        return canvases


def run_batch(engine, baseline: Baseline, prompts, params, max_new_tokens: int, repeat: int) -> dict:
    """Best of `repeat` interleaved runs per side: the CPU is shared, the minimum is the signal."""
    cl = engine.loaded.canvas_length
    engine_runs, baseline_runs = [], []
    for _ in range(repeat):
        finals, engine_s = timed(engine.run_until_done, prompts, params, max_new_tokens)
        engine_runs.append((engine_s, finals))
        _check(finals)
        canvases, baseline_s = timed(baseline.run, prompts)
        baseline_runs.append((baseline_s, canvases))
    engine_s, finals = min(engine_runs, key=lambda r: r[0])
    baseline_s, canvases = min(baseline_runs, key=lambda r: r[0])
    latencies = [f.extra["latency_s"] for f in finals]
    engine_tps = sum(f.canvases for f in finals) * cl / engine_s
    return _row("batch", len(prompts), engine_tps, canvases * cl / baseline_s, latencies,
                engine_s=round(engine_s, 3), baseline_s=round(baseline_s, 3), repeat=repeat,
                engine_canvases=sum(f.canvases for f in finals), baseline_canvases=canvases)


def run_staggered(engine, baseline: Baseline, prompts, params, max_new_tokens: int, load: float, seed: int,
                  repeat: int) -> dict:
    """Best of `repeat` interleaved runs per side (by throughput), the same arrival times for all."""
    cl = engine.loaded.canvas_length
    # Service rate of the baseline: time one request alone (after warm-up), one prompt per family.
    probe = prompts[: min(6, len(prompts))]
    service_s = timed(lambda: [baseline.run([p]) for p in probe])[1] / len(probe)
    rate = load / service_s  # arrivals per second
    rng = random.Random(seed)
    arrivals = list(itertools.accumulate((rng.expovariate(rate) for _ in prompts[1:]), initial=0.0))

    def engine_run() -> tuple[float, list[float]]:
        # Submitted at the arrival times (the engine steps on its own thread); latency = arrival to final event.
        handles, t0 = [], time.monotonic()
        for i, (p, q) in enumerate(zip(prompts, params)):
            time.sleep(max(0.0, t0 + arrivals[i] - time.monotonic()))
            handles.append(engine.submit(p, q, max_new_tokens, stream_steps=False))
        finals = [h.result() for h in handles]
        end = time.monotonic() - t0
        _check(finals)
        return sum(f.canvases for f in finals) * cl / end, [f.extra["latency_s"] for f in finals]

    def baseline_run() -> tuple[float, list[float]]:
        # One request at a time, first come first served, same arrival times.
        t0 = time.monotonic()
        latencies, canvases = [], 0
        for i, p in enumerate(prompts):
            time.sleep(max(0.0, t0 + arrivals[i] - time.monotonic()))
            canvases += baseline.run([p])
            latencies.append(time.monotonic() - t0 - arrivals[i])
        return canvases * cl / (time.monotonic() - t0), latencies

    runs = [(engine_run(), baseline_run()) for _ in range(repeat)]
    engine_tps, engine_lat = max((e for e, _ in runs), key=lambda r: r[0])
    baseline_tps, base_lat = max((b for _, b in runs), key=lambda r: r[0])
    return _row("staggered", len(prompts), engine_tps, baseline_tps, engine_lat,
                baseline_p50_s=round(percentile(base_lat, 0.5), 3), baseline_p95_s=round(percentile(base_lat, 0.95), 3),
                arrival_rate_per_s=round(rate, 3), baseline_service_s=round(service_s, 3), repeat=repeat)


def _row(bench: str, requests: int, engine_tps: float, baseline_tps: float, latencies: list[float], **more) -> dict:
    """A bench's row: both sides' canvas tokens per second, their ratio, the engine's p50/p95 latency, `more`."""
    return dict(bench=bench, requests=requests, engine_tokens_per_s=round(engine_tps, 2),
                baseline_tokens_per_s=round(baseline_tps, 2), ratio=round(engine_tps / baseline_tps, 3),
                p50_s=round(percentile(latencies, 0.5), 3), p95_s=round(percentile(latencies, 0.95), 3), **more)


def _check(finals) -> None:
    failed = [f for f in finals if f.status != Status.DONE]
    if failed:
        raise RuntimeError(f"{len(failed)} engine requests failed, first: {failed[0].error}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    from transformers.utils import logging as hf_logging

    from dgemma.engine import Engine, EngineConfig
    from dgemma.model.loading import load_model
    from dgemma.sampling import SamplingParams

    hf_logging.disable_progress_bar()
    engine_model = load_model(args.model, load_format=args.load_format)
    baseline_model = load_model(args.model, load_format=args.load_format)  # untouched: the engine patches its own copy's decoder
    gen = engine_model.model.generation_config
    overrides = {"max_denoising_steps": args.max_denoising_steps}
    max_new_tokens = args.max_new_tokens or getattr(gen, "max_new_tokens", None) or 64
    base_params = SamplingParams.from_generation_config(gen, **overrides)
    from transformers.models.diffusion_gemma.generation_diffusion_gemma import EntropyBoundSamplerConfig

    settings = dict(
        max_denoising_steps=base_params.max_denoising_steps, t_min=base_params.t_min, t_max=base_params.t_max,
        stability_threshold=base_params.stability_threshold, confidence_threshold=base_params.confidence_threshold,
        sampler_config=EntropyBoundSamplerConfig(entropy_bound=float(base_params.entropy_bound)),
    )
    baseline = Baseline(baseline_model, settings, max_new_tokens)

    engine = Engine(engine_model, EngineConfig(max_num_seqs=args.max_num_seqs))

    def seeded(n: int) -> list[SamplingParams]:  # request i's seed: --seed + i
        return [SamplingParams.from_generation_config(gen, seed=args.seed + i, **overrides) for i in range(n)]

    with engine:
        warm = bench_prompts(2)  # calibration, first-call allocations: out of the timed runs
        engine.run_until_done(warm, [base_params] * 2, max_new_tokens)
        baseline.run(warm)
        torch.manual_seed(args.seed)  # transformers' sampler draws from the global stream
        if args.only in (None, "batch"):
            prompts = bench_prompts(args.requests)
            _print(run_batch(engine, baseline, prompts, seeded(len(prompts)), max_new_tokens, args.repeat), args.json)
        if args.only in (None, "staggered") and args.staggered:
            prompts = bench_prompts(args.staggered)
            _print(run_staggered(engine, baseline, prompts, seeded(len(prompts)), max_new_tokens, args.load, args.seed,
                                 args.staggered_repeat), args.json)
    return 0


def _print(result: dict, as_json: bool) -> None:
    if as_json:
        print_row(result, True)
        return
    extra = (f"  (baseline p50 {result['baseline_p50_s']} s, p95 {result['baseline_p95_s']} s)"
             if result["bench"] == "staggered" else "")
    print(f"{result['bench']:>9}: engine {result['engine_tokens_per_s']:>9.1f} canvas-tok/s | generate() "
          f"{result['baseline_tokens_per_s']:>9.1f} | ratio {result['ratio']:.2f}x | engine p50 {result['p50_s']} s, "
          f"p95 {result['p95_s']} s{extra}", flush=True)
