"""`python -m dgemma.bench sampler`: the sampler's transient memory and time, untiled vs tiled.

For each num_decode it runs one denoising step twice on the same decoder hidden states (each step
applies the LM head itself, as in the engine) and the same seeded requests: once as a single tile
(the baseline: what runs out of memory), once tiled against the memory budget. Printed per row:
the measured peak transient, copies per request, the tile plan, the median seconds of interleaved
repeats, and ratios: t/u tiled over untiled; floor, the floor (projection, one softmax, the
self-conditioning matmul: the least any step can do) tiled as that row, over it in one tile;
=untiled, whether tiling changed any token (it must not); c/ref t and =ref, chunked against the
reference; /seed, against the seed's eager step (--baseline seed); /floor; p/t, the step with
starts and pins over the tiled one (--pins). --scheduler runs every row once per scheduler;
--meta measures real-scale shapes on meta tensors (no RAM; every allocated byte still counted).
docs/benchmarks.md has the method and the figures.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import psutil
import torch

from dgemma.bench import print_row, sync
from dgemma.bench.floor import Floor
from dgemma.cli import ArgumentParser, positive_int, size_arg
from dgemma.memory import CudaMemory, HostMemory, MemoryDevice, MiB, VirtualDevice, format_bytes, resolve_device
from dgemma.metrics import shown
from dgemma.sampling import SAMPLER_STEPS, SCHEDULERS, LMHead, SamplerConfig, TiledSampler, seed_tile
from dgemma.sampling import SamplingParams
from dgemma.sampling.schedulers import scheduler_defaults
from dgemma.sampling.start import CanvasStart

SOFTCAP = 30.0  # Gemma's final-logit softcap, applied by the chunked sampler's projection


@dataclass
class Case:
    vocab: int
    canvas_length: int
    hidden: int
    num_decode: int
    device: torch.device
    meta: bool
    budget: int | None
    repeats: int
    greedy: bool
    chunk_size: int | None = None
    clock: str = "wall"  # wall: perf_counter; cpu: this process's CPU seconds (all its threads)
    scheduler: str = "entropy_bound"

    def now(self) -> float:
        return time.process_time() if self.clock == "cpu" else time.perf_counter()


class _UnboundedTracking(MemoryDevice):
    """The untiled baseline's memory: counts transients (track=True), never refuses."""

    name = "unbounded"

    def __init__(self, device: torch.device, track: bool = True):
        self.device, self.track = device, track

    def free_bytes(self) -> int:
        return 2**62

    def measure(self):
        return CudaMemory(self.device).measure() if self.device.type == "cuda" else HostMemory(track=self.track).measure()


def _budget_memory(case: Case, track: bool = True) -> MemoryDevice:
    if case.device.type == "cuda":
        total = torch.cuda.get_device_properties(case.device).total_memory
        fraction = 1.0 if case.budget is None else min(1.0, case.budget / total)
        return CudaMemory(case.device, fraction)
    if case.budget is None:
        if case.meta:
            return _UnboundedTracking(case.device)
        # free RAM as the budget: the same plan whether or not every op is counted
        return VirtualDevice(int(psutil.virtual_memory().available)) if track else HostMemory()
    return VirtualDevice(case.budget)  # a budget below free RAM is enforced by counting every op


def _make(case: Case, impl: str, tiling: str, memory: MemoryDevice, head: LMHead) -> TiledSampler:
    # Our steps take the decoder's hidden states and project them per tile (or per vocab chunk),
    # as the engine hands them (dgemma/engine/phases.py): their transient counts the projection's
    # output. The seed's step takes the logits as input (they do not count).
    embed = head.weight
    if impl == "seed":
        return TiledSampler(SamplerConfig(case.num_decode, case.canvas_length, case.vocab, embed, case.hidden**0.5,
                                          memory=memory, tiling="off", impl="seed", tile_fn=seed_tile))  # fmt: skip
    config = SamplerConfig(case.num_decode, case.canvas_length, case.vocab, embed, case.hidden**0.5, memory=memory,
                           tiling=tiling, impl=impl, lm_head=head, chunk_size=case.chunk_size)
    return TiledSampler(config)


def _start(sampler: TiledSampler, case: Case, pinned: bool = False) -> None:
    for slot in range(case.num_decode):
        start = _canvas_start(case, slot) if pinned else None
        sampler.start_canvas(slot, SamplingParams(seed=1000 + slot, greedy=case.greedy,
                                                   scheduler=scheduler_defaults(case.scheduler)), 0, start)


def _canvas_start(case: Case, slot: int) -> CanvasStart:
    """A request that starts from text over half its canvas and pins every fourth position."""
    CL, V = case.canvas_length, case.vocab
    tokens = tuple((slot + i) % V for i in range(CL // 2))
    return CanvasStart(tokens, tuple((p, (7 * p + slot) % V) for p in range(0, CL, 4)))


class _Config:
    """One (impl, mode) of a case: its sampler, its timings, its last plan and state.

    On the CPU, counting every op's bytes (a dispatch mode around each call) costs time that the
    engine's steps never pay, and the floor does not either: so the memory figures come from one
    untimed, counted run (`measure`), and the timed runs (`run_once`) count nothing unless a
    budget below free RAM must be enforced (the lesson's virtual device, which does pay it).
    """

    def __init__(self, case: Case, impl: str, mode: str, inputs: dict[str, torch.Tensor]):
        self.case, self.impl, self.mode, self.inputs = case, impl, mode, inputs
        self.times: list[float] = []
        self.plan = None

    def _sampler(self, track: bool) -> TiledSampler:
        case = self.case
        if self.mode == "untiled":
            if case.device.type == "cuda":
                torch.cuda.set_per_process_memory_fraction(1.0, case.device)
            memory: MemoryDevice = _UnboundedTracking(case.device, track)
        else:
            memory = _budget_memory(case, track)
        return _make(case, self.impl, "off" if self.mode == "untiled" else "auto", memory, self.inputs["head"])

    def measure(self) -> None:
        """One counted, untimed step: the row's plan, peak transient and state."""
        self._step(track=True)

    def run_once(self) -> None:
        """One timed step (counting nothing it need not: see the class)."""
        self.times.append(self._step(track=self.case.meta))

    def _step(self, track: bool) -> float:
        case, inputs = self.case, self.inputs
        sampler = self._sampler(track)  # (CUDA: sets this mode's memory cap)
        _start(sampler, case, pinned=self.mode == "pinned")
        sampler.calibration()  # measured once per sampler (on meta tensors): not part of a step
        slots = list(range(case.num_decode))
        sync(case.device)
        t0 = case.now()
        if sampler.lm_head is not None:
            out = sampler.step(None, slots, hidden=inputs["hidden"])
        else:
            # The seed's step is handed logits (its input: not counted as its transient), but they
            # come from the model's LM head, so the projection is timed with it: the same work as ours.
            out = sampler.step(inputs["logits"] if case.meta else inputs["head"].project(inputs["hidden"]), slots)
        sync(case.device)
        seconds = case.now() - t0
        if track:
            self.plan = out.plan
            self.state = None
            if not case.meta:  # what "identical" compares: the tokens and the acceptance masks
                self.state = {"canvas": sampler.canvas.clone(), "draft": sampler.draft.clone(),
                              "accepted": sampler.out_accepted.clone(), "entropy": sampler.out_entropy.clone()}  # fmt: skip
        return seconds

    def row(self) -> dict:
        case, plan = self.case, self.plan
        return {
            "scheduler": case.scheduler, "impl": self.impl, "mode": self.mode, "num_decode": case.num_decode,
            "canvas_length": case.canvas_length, "vocab": case.vocab, "group": plan.group, "tiles": len(plan.tiles),
            "_tiles": plan.tiles, "peak_transient_bytes": plan.peak_transient_bytes,
            # docs/design.md: copies per request = peak / (requests in the tile x CL x vocab x 4)
            "copies_per_request": round(plan.peak_transient_bytes / (max(plan.tiles) * case.canvas_length * case.vocab * 4), 3),
            "seconds": None if case.meta else statistics.median(self.times), "identical_to_untiled": None, "_state": self.state,
        }  # fmt: skip


def _compare(a: dict | None, b: dict | None) -> tuple[bool | None, float | None]:
    """Whether two states' tokens are identical, and their entropies' largest relative difference (None: no state)."""
    if a is None or b is None:
        return None, None
    return (all(torch.equal(a[k], b[k]) for k in ("canvas", "draft", "accepted")),
            float(((a["entropy"] - b["entropy"]).abs() / a["entropy"].abs().clamp(min=1e-6)).max()))


def _inputs(case: Case) -> dict:
    """Seeded embedding (tied LM head), decoder hidden states, and the logits they project to."""
    device = torch.device("meta") if case.meta else case.device
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    embed = torch.empty(case.vocab, case.hidden, dtype=dtype, device=device)
    hidden = torch.empty(case.num_decode, case.canvas_length, case.hidden, dtype=dtype, device=device)
    if not case.meta:
        gen = torch.Generator(device=device).manual_seed(case.num_decode)
        embed.normal_(generator=gen).mul_(case.hidden**-0.5)
        hidden.normal_(generator=gen).mul_(4.0)
    # Only the meta run hands the seed precomputed logits; a real run projects them in the timed
    # step, so holding a copy here would only eat the budget the tiled rows are measured under.
    head = LMHead(embed, SOFTCAP)
    logits = head.project(hidden) if case.meta else None
    return {"head": head, "hidden": hidden, "logits": logits}


def run_case(case: Case, impls: list[str], baseline: str | None = None, pins: bool = False) -> list[dict]:
    """Rows for one num_decode: (impl, untiled) and (impl, tiled) for each implementation, after
    the seed's step (untiled only) when `baseline` is "seed", and (impl, pinned) with `pins`."""
    inputs = _inputs(case)
    seed = [_Config(case, "seed", "untiled", inputs)] if baseline == "seed" else []
    configs = [_Config(case, impl, mode, inputs) for impl in impls for mode in ("untiled", "tiled")]
    pinned = [_Config(case, impl, "pinned", inputs) for impl in impls] if pins else []
    head = inputs["head"]
    floor = Floor(head, inputs["hidden"], case.now)
    tiled_floors: dict[tuple[int, ...], Floor] = {}  # the floor tiled as each tiled row's plan tiles it
    if not case.meta:  # memory and tokens, counted (and, on a GPU, the warm-up)
        for config in seed + configs + pinned:
            config.measure()
            tiles = config.plan.tiles
            if config.mode == "tiled" and len(tiles) > 1 and tiles not in tiled_floors:
                tiled_floors[tiles] = Floor(head, inputs["hidden"], case.now, tiles)
    # Interleave the repeats so drift on a noisy machine hits every config alike, and rotate the
    # order each round (ABCD BCDA ...): no config always runs right after another. The seed's
    # step runs its repeats after all of them: its gigabytes of fresh pages slowed whatever ran
    # next (by a quarter, in hand timings of the reference at 16 x 32 on two threads), and its
    # own ratios are far from 1, where that is noise.
    timed = configs + pinned + ([] if case.meta else [floor, *tiled_floors.values()])
    for round_ in range(1 if case.meta else case.repeats):
        for i in range(len(timed)):
            timed[(round_ + i) % len(timed)].run_once()
    for _ in range(1 if case.meta else case.repeats):
        for config in seed:
            config.run_once()
    rows = [config.row() for config in configs]
    baseline_row = rows[0]
    for untiled, tiled in zip(rows[::2], rows[1::2]):
        untiled["identical_to_untiled"] = None if case.meta else True
        tiled["identical_to_untiled"] = _compare(untiled["_state"], tiled["_state"])[0]
        if untiled["impl"] != "reference":
            for row in (untiled, tiled):
                row["identical_to_reference"], row["entropy_max_rel_diff_vs_reference"] = _compare(
                    baseline_row["_state"], row["_state"])
            if baseline_row["seconds"] and untiled["seconds"]:
                untiled["time_ratio_vs_reference"] = round(untiled["seconds"] / baseline_row["seconds"], 3)
        if untiled["seconds"] and tiled["seconds"]:
            tiled["time_ratio_tiled_vs_untiled"] = round(tiled["seconds"] / untiled["seconds"], 3)
            # what the same tiles cost the floor: the least this tiling can add on this machine
            tiled_floor = tiled_floors.get(tuple(tiled["_tiles"]))
            tiled["floor_time_ratio_tiled_vs_untiled"] = (
                round(statistics.median(tiled_floor.times) / statistics.median(floor.times), 3) if tiled_floor else 1.0
            )
    for config, tiled in zip(pinned, rows[1::2]):
        row = config.row()  # its tokens differ by design: it holds pins
        if row["seconds"] and tiled["seconds"]:
            row["time_ratio_pinned_vs_tiled"] = round(row["seconds"] / tiled["seconds"], 3)
        rows.append(row)
    seed_rows = [config.row() for config in seed]
    for row in rows:
        if seed_rows and seed_rows[0]["seconds"] and row["seconds"]:
            row["time_ratio_vs_seed"] = round(row["seconds"] / seed_rows[0]["seconds"], 3)
    rows = seed_rows + rows
    floor_seconds = statistics.median(floor.times) if floor.times else None
    for row in rows:
        row.pop("_state")
        row.pop("_tiles")
        row["floor_seconds"] = floor_seconds
        if floor_seconds and row["seconds"]:
            row["time_ratio_vs_floor"] = round(row["seconds"] / floor_seconds, 3)
    return rows


def _check_fits_in_ram(case: Case) -> None:
    if case.meta or case.device.type != "cpu":
        return
    need = case.num_decode * case.canvas_length * case.vocab * 4 * 9  # logits + ~7 copies + slack
    have = psutil.virtual_memory().available
    if need > 0.8 * have:
        raise ValueError(
            f"num_decode {case.num_decode} at CL {case.canvas_length} x vocab {case.vocab} needs about "
            f"{format_bytes(need)} of RAM ({format_bytes(have)} available): use --meta to measure without RAM"
        )


def _table(rows: list[dict]) -> str:
    head = (f"{'scheduler':>16} {'impl':>9} {'mode':>8} {'n':>3} {'group':>5} {'tiles':>5} {'peak MiB':>10} {'copies/req':>10} "
            f"{'seconds':>8} {'t/u':>6} {'floor':>6} {'=untiled':>8} {'c/ref t':>7} {'=ref':>5} {'/seed':>6} {'/floor':>6} {'p/t':>6}")  # fmt: skip
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(
            f"{r['scheduler']:>16} {r['impl']:>9} {r['mode']:>8} {r['num_decode']:>3} {r['group']:>5} {r['tiles']:>5} "
            f"{r['peak_transient_bytes'] / MiB:>10.1f} {r['copies_per_request']:>10.2f} {shown(r['seconds'], '.4f'):>8} "
            f"{shown(r.get('time_ratio_tiled_vs_untiled'), '.3f'):>6} {shown(r.get('floor_time_ratio_tiled_vs_untiled'), '.3f'):>6} "
            f"{shown(r['identical_to_untiled'], ''):>8} "
            f"{shown(r.get('time_ratio_vs_reference'), '.3f'):>7} {shown(r.get('identical_to_reference'), ''):>5} "
            f"{shown(r.get('time_ratio_vs_seed'), '.3f'):>6} {shown(r.get('time_ratio_vs_floor'), '.3f'):>6} "
            f"{shown(r.get('time_ratio_pinned_vs_tiled'), '.3f'):>6}"
        )
    return "\n".join(lines)


def build_parser(prog: str = "python -m dgemma.bench sampler") -> ArgumentParser:
    p = ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    p.add_argument("--vocab", type=positive_int, default=262_144)
    p.add_argument("--canvas-length", type=positive_int, default=256)
    p.add_argument("--hidden", type=positive_int, default=2816, help="embedding width for the self-conditioning matmul")
    p.add_argument("--num-decode", type=positive_int, nargs="+", default=[1, 2, 4, 8, 16, 32])
    p.add_argument("--budget", type=size_arg, default=None, help="memory budget for the tiled run, e.g. 8GiB")
    p.add_argument("--meta", action="store_true", help="measure on meta tensors: real-scale shapes need no RAM")
    p.add_argument("--device", default="cpu", help="cpu | cuda | auto")
    p.add_argument("--impl", nargs="+", choices=SAMPLER_STEPS, default=["reference"], help="step implementations")
    p.add_argument("--baseline", choices=["seed"], default=None, help="also time the seed's eager step (global RNG, 7 copies)")
    p.add_argument("--chunk-size", type=positive_int, default=None, help="chunked sampler's vocab chunk (default: from free memory)")
    p.add_argument("--repeats", type=positive_int, default=3, help="timed repeats per row (median reported)")
    p.add_argument("--greedy", action="store_true", help="greedy instead of seeded stochastic sampling")
    p.add_argument("--scheduler", nargs="+", choices=SCHEDULERS, default=["entropy_bound"],
                   help="the schedulers to run, each at its defaults (default: entropy_bound)")
    p.add_argument("--pins", action="store_true", help="also time the tiled step with starts and pins (a 'pinned' row)")
    p.add_argument("--threads", type=positive_int, default=None, help="torch's intra-op threads (default: torch's own)")
    p.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                   help="wall: elapsed seconds; cpu: the process's CPU seconds, all threads (steadier on shared cores)")
    p.add_argument("--json", action="store_true", help="one JSON object per line per (num_decode, mode)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.vocab < 2:
        raise ValueError(f"--vocab must be >= 2, got {args.vocab}")
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    rows = []
    for n in args.num_decode:
        for scheduler in args.scheduler:
            case = Case(args.vocab, args.canvas_length, args.hidden, n, device, args.meta, args.budget, args.repeats,
                        args.greedy, args.chunk_size, args.clock, scheduler)  # fmt: skip
            _check_fits_in_ram(case)
            for row in run_case(case, args.impl, args.baseline, args.pins):
                rows.append(row)
                if args.json:
                    print_row(row, True)
    if not args.json:
        budget = "free memory" if args.budget is None else format_bytes(args.budget)
        clock = "" if args.clock == "wall" else ", CPU seconds"
        print(f"sampler step, CL={args.canvas_length} vocab={args.vocab} device={'meta' if args.meta else device}, tiled against {budget}{clock}")
        print(_table(rows))
        floors = sorted({(r["num_decode"], r["scheduler"], r["floor_seconds"]) for r in rows if r["floor_seconds"] is not None})
        for n, scheduler, seconds in floors:
            print(f"floor_seconds (n={n}, {scheduler}'s rounds: projection + one softmax + the self-conditioning matmul): "
                  f"{seconds:.4f}")
        if any(r.get("floor_time_ratio_tiled_vs_untiled") for r in rows):
            print("floor (t/u): the floor run tile by tile as the tiled row's plan tiles it, over the floor in one"
                  " tile: what the same split costs the least any step can do")
    return 0
