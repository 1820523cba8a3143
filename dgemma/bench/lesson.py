"""`python -m dgemma.bench lesson`: what the lesson's tiled run costs against its untiled one.

The lesson (the "Tiling vs OOM" tab) runs one batch under a memory budget, as engine runs with
the lesson's options. Here each step implementation runs it twice, alternated, on one engine with
the same prompts and seeds: tiled under the budget the tab suggests
(`dgemma.memory.lesson.suggest_budget`: the untiled step does not fit in it), and
untiled with no budget (the tab's rerun with room to spare), after one untimed run of each. Printed per implementation: the
tiles each call ran, the sampler's seconds of the whole run (the TilePlans' own clocks: the
decoder's time, the same in both, is left out), their median over the repeats, tiled/untiled,
and whether the tokens came out identical (they must). "Real scale" (the default) pads the
logits to vocab 262,144, as the tab does.
"""

from __future__ import annotations

import statistics
from collections import Counter

import torch

from dgemma.cli import ArgumentParser, positive_int
from dgemma.sampling import SAMPLER_STEPS, SamplingParams


def build_parser(prog: str = "python -m dgemma.bench lesson") -> ArgumentParser:
    p = ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="hub id or local path (default: the embedded model)")
    p.add_argument("--load-format", default="auto", choices=["auto", "dummy"],
                   help="dummy: random weights of --model's config, built on the device")
    p.add_argument("--requests", type=positive_int, default=16, help="the lesson's batch (the tab's default: 16)")
    p.add_argument("--steps", type=positive_int, default=8, help="max denoising steps of the one canvas")
    p.add_argument("--impl", nargs="+", default=["reference", "chunked"], help=f"step implementations: {', '.join(SAMPLER_STEPS)}")
    p.add_argument("--repeats", type=positive_int, default=4, help="runs of each mode (median reported)")
    p.add_argument("--threads", type=positive_int, default=None, help="torch's intra-op threads (default: torch's own)")
    p.add_argument("--model-vocab", action="store_true", help="the model's own vocabulary, not padded to 262,144")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    unknown = [i for i in args.impl if i not in SAMPLER_STEPS]
    if unknown:
        raise ValueError(f"unknown --impl {unknown[0]!r}: choose from {', '.join(SAMPLER_STEPS)}")
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    from dgemma.engine import EngineConfig, EngineCore
    from dgemma.examples import LESSON_PROMPTS
    from dgemma.gpus import RELEASED_VOCAB
    from dgemma.model.loading import load_model
    from dgemma.sampling import RunOptions
    from dgemma.memory.lesson import lesson_model, lesson_vocab
    from dgemma.serving.backend import suggest_budget
    from dgemma.units import parse_size

    core = EngineCore(load_model(args.model, load_format=args.load_format), EngineConfig(max_num_seqs=args.requests))
    real_scale = not args.model_vocab
    model = lesson_model(core.loaded, args.requests, LESSON_PROMPTS)
    budget = suggest_budget(model, args.requests, real_scale)
    vocab = f"vocab padded to {lesson_vocab(model, True):,}" if real_scale else f"vocab {core.loaded.vocab_size:,}"
    print(f"lesson: {args.requests} requests, CL {core.loaded.canvas_length}, {vocab}, tiled under {budget}, "
          f"{torch.get_num_threads()} threads; the sampler's seconds per run")
    print(f"{'impl':>9} {'tiles per call (tiled)':>24} {'tiled s':>8} {'untiled s':>9} {'t/u':>6} {'identical':>9}")
    for impl in args.impl:
        seconds: dict[str, list[float]] = {"tiled": [], "untiled": []}
        tokens, tiles = {}, Counter()
        for round_ in range(-1, args.repeats):  # round -1 warms up; then alternated, each mode first by turns
            for mode in ("tiled", "untiled") if round_ % 2 == 0 else ("untiled", "tiled"):
                tiled = mode == "tiled"
                options = RunOptions(tiling="auto" if tiled else "off", sampler=impl, memory_budget=parse_size(budget) if tiled else None,
                                     fail_on_oom=True, pad_vocab=RELEASED_VOCAB if real_scale else None)
                ids, plans = lesson_run(core, args.requests, args.steps, options, f"the {mode} {impl} run")
                if round_ < 0:
                    continue
                seconds[mode].append(sum(plan.seconds for plan in plans))
                tokens[mode] = ids
                if tiled and round_ == 0:
                    tiles.update(plan.tiles for plan in plans)
        t, u = (statistics.median(seconds[m]) for m in ("tiled", "untiled"))
        shown = " ".join(f"{'+'.join(map(str, k))}x{n}" for k, n in sorted(tiles.items(), key=lambda kv: -len(kv[0])))
        print(f"{impl:>9} {shown:>24} {t:>8.3f} {u:>9.3f} {t / u:>6.3f} {str(tokens['tiled'] == tokens['untiled']):>9}")
    return 0


def lesson_run(core, requests: int, steps: int, options, what: str) -> tuple[list[tuple[int, ...]], list]:
    """The lesson's batch as one engine run with `options`: each request's tokens and the run's tile
    plans; a request that failed is one ValueError naming `what`."""
    from dgemma.events import TilePlan
    from dgemma.examples import lesson_prompts

    watch = core.subscribe(coalesce=False)
    handles = [core.submit(p, SamplingParams(max_denoising_steps=steps, seed=5 + i), core.loaded.canvas_length,
                           stream_steps=False, options=options) for i, p in enumerate(lesson_prompts(requests))]
    while core.has_unfinished():
        core.step()
    plans = [e for e in watch.poll(0) if isinstance(e, TilePlan)]
    core.unsubscribe(watch)
    finals = [h.result(0) for h in handles]
    failed = next((f for f in finals if f.status != "done"), None)
    if failed is not None:
        raise ValueError(f"{what} failed: {failed.error or failed.status}")
    return [f.token_ids for f in finals], plans
