"""`python -m dgemma.bench lesson`: what the lesson's tiled run costs against its untiled one.

Each step implementation runs the lesson tab's batch twice, alternated after one untimed run of each,
on one engine with the same prompts and seeds: tiled under the budget the tab suggests (the untiled
step does not fit in it), and untiled with no budget. Printed per implementation: the tiles each call
ran, the median sampler seconds of a run (its TilePlans' own clocks: the decoder's time is left out),
tiled/untiled, and whether the tokens came out identical (they must). The logits are padded to vocab
262,144, as the tab pads them, unless --model-vocab.
"""

from __future__ import annotations

import statistics
from collections import Counter
import torch

from dgemma.events import Status
from dgemma.cli import ArgumentParser, positive_int
from dgemma.sampling import SAMPLER_STEPS


def build_parser(prog: str = "python -m dgemma.bench lesson") -> ArgumentParser:
    p = ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="hub id or local path (default: the embedded model)")
    p.add_argument("--load-format", default="auto", choices=["auto", "dummy"],
                   help="dummy: random weights of --model's config, built on the device")
    p.add_argument("--requests", type=positive_int, default=16, help="the lesson's batch (the tab's default: 16)")
    p.add_argument("--steps", type=positive_int, default=8, help="max denoising steps of the one canvas (the tab's cap: 48)")
    p.add_argument("--impl", nargs="+", choices=SAMPLER_STEPS, default=["reference", "chunked"], help="step implementations")
    p.add_argument("--repeats", type=positive_int, default=4, help="runs of each mode (median reported)")
    p.add_argument("--threads", type=positive_int, default=None, help="torch's intra-op threads (default: torch's own)")
    p.add_argument("--model-vocab", action="store_true", help="the model's own vocabulary, not padded to 262,144")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    from dgemma.engine import EngineConfig
    from dgemma.gpus import RELEASED_VOCAB
    from dgemma.model.loading import load_model
    from dgemma.serving.engine_backend import EngineBackend
    from dgemma.settings import Limits
    from dgemma.ui.lesson.tab import lesson_call

    loaded = load_model(args.model, load_format=args.load_format)
    backend = EngineBackend(loaded, EngineConfig(max_num_seqs=args.requests), Limits(max_prompts=args.requests), None)
    real_scale = not args.model_vocab
    budget = backend.suggest_budget(args.requests, real_scale)  # the tab's: the memory ledger's suggestion
    vocab = f"vocab padded to {RELEASED_VOCAB:,}" if real_scale else f"vocab {loaded.vocab_size:,}"
    print(f"lesson: {args.requests} requests, CL {loaded.canvas_length}, {vocab}, tiled under {budget}, "
          f"{torch.get_num_threads()} threads; the sampler's seconds per run")
    print(f"{'impl':>9} {'tiles per call (tiled)':>24} {'tiled s':>8} {'untiled s':>9} {'t/u':>6} {'identical':>9}")
    try:
        for impl in args.impl:
            seconds: dict[str, list[float]] = {"tiled": [], "untiled": []}
            tokens, tiles = {}, Counter()
            for round_ in range(-1, args.repeats):  # round -1 warms up; then alternated, each mode first by turns
                for mode in ("tiled", "untiled") if round_ % 2 == 0 else ("untiled", "tiled"):
                    tiled = mode == "tiled"  # through the tab's door, as the tab makes each of its runs
                    call = lesson_call(backend, args.requests, args.steps, None, budget if tiled else None,
                                       "auto" if tiled else "off", impl, real_scale)
                    ids, plans = lesson_run(backend, call, f"the {mode} {impl} run")
                    if round_ < 0:
                        continue
                    seconds[mode].append(sum(plan.seconds for plan in plans))
                    tokens[mode] = ids
                    if tiled and round_ == 0:
                        tiles.update(plan.tiles for plan in plans)
            t, u = (statistics.median(seconds[m]) for m in ("tiled", "untiled"))
            shown = " ".join(f"{'+'.join(map(str, k))}x{n}" for k, n in sorted(tiles.items(), key=lambda kv: -len(kv[0])))
            print(f"{impl:>9} {shown:>24} {t:>8.3f} {u:>9.3f} {t / u:>6.3f} {str(tokens['tiled'] == tokens['untiled']):>9}")
    finally:
        backend.close()
    return 0


def lesson_run(backend, call, what: str) -> tuple[list[tuple[int, ...]], list]:
    """The lesson's `call` as one engine run (the backend's run, as the tab's): each request's tokens and the
    run's tile plans; a request that failed is one ValueError naming `what`."""
    from dgemma.serving.backend import read_run

    run = backend.start(call, stream=False)
    progress = read_run(run)
    run.close()
    failed = next((e for e in progress.last.values() if e.status != Status.DONE), None)
    if failed is not None:
        raise ValueError(f"{what} failed: {failed.error or failed.status}")
    return [e.token_ids for e in progress.last.values()], progress.plans
