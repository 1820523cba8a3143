"""`python -m dgemma.plan`: what the sampler needs on real GPUs, worked out before renting one.

For each GPU and each number of concurrent requests, one row: the weights, what is left free,
and the peak transient of one sampler call four ways (docs/tiling.md walks through them):

- untiled:  the seed's eager step as one tile (7 fp32 [CL, vocab] copies per request);
- seed:     the same step in groups of the seed's heuristic,
            `max(1, min(num_decode, 0.5 * free // (CL * vocab * 4 * 10)))`;
- tiled:    this project's planner (`plan_tiles`) over this project's reference step, as the
            engine runs it (hidden states in, the LM head applied per tile);
- chunked:  the vocab-chunked step at the chunk size the sampler picks, tiled by the planner.

The closing line adds the tiled step's copies per request for each scheduler's costliest row
(`calibration.COSTLIEST`): the entropy bound's sample (block refinement and DDIM at temperature 0
cost the same), a tempered sample (block refinement or DDIM at a temperature), a DDIM corrector
sweep (float64 logits).

Nothing touches a device: the weights are a published size or a local config's estimate, and
every step is calibrated on meta tensors (`calibrate_tile`), shapes without memory.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from dgemma.cli import ArgumentParser, positive_int, run_cli, size_arg
from dgemma.gpus import GPUS, RELEASED_ID, RELEASED_VOCAB, ZEROGPU_SIZES, Gpu
from dgemma.memory import GiB, Calibration, format_bytes, plan_tiles
from dgemma.memory.ledger import ModelFacts, RunShape, run_ledger
from dgemma.sampling import calibrate_tile, calibration_for, seed_tile
from dgemma.sampling.calibration import COSTLIEST
from dgemma.sampling.chunked import chunk_ladder

FRACTION = 0.5  # the planner's share of free memory, as the sampler uses it
SEED_COPIES = 10  # the seed's assumed fp32 copies per request ("eager peaks at ~8; pad")
RUNTIME_RESERVE = 2 * GiB
"""The ledger's reserve, held back from every GPU before the sampler sees free memory: the CUDA context
(~0.5 GiB), cuBLAS workspaces, the allocator's rounding, what the driver keeps of the spec-sheet capacity,
and one decoder call's activations. The engine's sampler state is counted (a slot a request); KV caches
are not: the plan has no prompts, and the sampler is its subject."""
REQUESTS = (1, 2, 4, 8, 16, 32, 64)


@dataclass(frozen=True)
class ModelSpec:
    """What the plan needs to know about a model: its weights and the sampler's shapes."""

    name: str
    weights_bytes: int
    canvas_length: int
    vocab_size: int
    hidden_size: int
    softcap: float | None = 30.0


RELEASED = ModelSpec(RELEASED_ID, 26 * 10**9 * 2, 256, RELEASED_VOCAB, 2816)
"""The released checkpoint: 26 B parameters (its published size) in bf16, canvas 256, vocab
262,144, hidden 2816 (the hidden size only sizes the [CL, hidden] soft embedding)."""


# --------------------------------------------------------------------------- calibrations (meta)


def model_facts(model: ModelSpec, slots: int, canvas_length: int | None = None) -> ModelFacts:
    """The ledger's facts of `model` served in bf16 on a GPU with `slots` requests at once (no KV term:
    the plan has no prompts, and the sampler is its subject)."""
    return ModelFacts(model.weights_bytes, canvas_length or model.canvas_length, model.vocab_size, model.hidden_size,
                      "bfloat16", 0, slots, "cuda", model.softcap)


def untiled_calibration(canvas_length: int, vocab_size: int, hidden_size: int) -> Calibration:
    """The seed's eager step (`seed_tile`): the logits are its input (made before the sampler), 7 copies at its peak."""
    embed = torch.empty(vocab_size, hidden_size, dtype=torch.bfloat16, device="meta")
    return calibrate_tile(seed_tile, canvas_length, vocab_size, embed)


def chunk_for(requests: int, free_bytes: int, model: ModelSpec, canvas_length: int) -> int:
    """The chunk `choose_chunk_size` picks: the widest whose step holds every request in one tile
    within the planner's share of free memory, else the narrowest (then the tiles split)."""
    ladder = chunk_ladder(model.vocab_size)
    for chunk in ladder:
        calibration = calibration_for(model_facts(model, requests, canvas_length), impl="chunked", chunk=chunk)
        if calibration.tile_bytes(1) <= free_bytes and plan_tiles(requests, free_bytes, calibration, FRACTION) >= requests:
            return chunk
    return ladder[-1]


# --------------------------------------------------------------------------- the rows


def _tiles(requests: int, free_bytes: int, calibration: Calibration) -> tuple[int | None, int | None, int | None]:
    """(largest tile, tiles, peak) as the sampler runs them: as many tiles as the planner's group
    needs, their sizes even (`split_tiles`); Nones where not even one request fits."""
    if calibration.tile_bytes(1) > free_bytes:
        return None, None, None
    tiles = math.ceil(requests / plan_tiles(requests, free_bytes, calibration, FRACTION))
    largest = math.ceil(requests / tiles)
    return largest, tiles, calibration.tile_bytes(largest)


def plan_row(gpu: Gpu, requests: int, model: ModelSpec, canvas_length: int | None = None,
             reserve_bytes: int = RUNTIME_RESERVE, row: str = "sample") -> dict:  # fmt: skip
    """One (GPU, requests) row; peaks in bytes, None where the step cannot run at all. `row`: the
    scheduler's costliest kind of row the tiled step is planned for (a key of `calibration.COSTLIEST`:
    "sample", "tempered", "sweep")."""
    cl = canvas_length or model.canvas_length
    vocab = model.vocab_size
    facts = model_facts(model, requests, cl)
    tiled = calibration_for(facts, kind=row)
    # What the GPU holds before the sampler call: the reserve, the weights and the engine's sampler state.
    ledger = run_ledger(facts, RunShape((0,) * requests, own_sampler=False), tiled, gpu.total_bytes, reserve=reserve_bytes)
    fits_weights = ledger.holds_weights
    free = ledger.free if fits_weights else 0
    untiled = untiled_calibration(cl, vocab, model.hidden_size)
    # The seed's (vLLM's) group size, exactly: ×10 fp32 copies assumed, half of free memory.
    group = int(max(1, min(requests, 0.5 * free // (cl * vocab * 4 * SEED_COPIES))))
    tile_size, tiles, tiled_peak = _tiles(requests, free, tiled)
    chunk = chunked_tile_size = chunked_tiles = chunked_peak = None
    if fits_weights:
        chunk = chunk_for(requests, free, model, cl)
        chunked = calibration_for(facts, impl="chunked", chunk=chunk)
        chunked_tile_size, chunked_tiles, chunked_peak = _tiles(requests, free, chunked)
    return dict(
        gpu=gpu.label, gpu_bytes=gpu.total_bytes, weights_bytes=model.weights_bytes, reserve_bytes=reserve_bytes,
        fits_weights=fits_weights, free_bytes=free, requests=requests, canvas_length=cl, vocab=vocab,
        untiled_peak_bytes=untiled.tile_bytes(requests), fits_untiled=untiled.tile_bytes(requests) <= free,
        seed_group=group, seed_tiles=math.ceil(requests / group), seed_peak_bytes=untiled.tile_bytes(group),
        fits_seed=untiled.tile_bytes(group) <= free,
        tile_size=tile_size, tiles=tiles, tiled_peak_bytes=tiled_peak,
        chunk_size=chunk, chunked_tile_size=chunked_tile_size, chunked_tiles=chunked_tiles,
        chunked_peak_bytes=chunked_peak,
    )  # fmt: skip


def plan_rows(model: ModelSpec = RELEASED, gpus: tuple[Gpu, ...] = GPUS, requests: tuple[int, ...] = REQUESTS,
              canvas_length: int | None = None, reserve_bytes: int = RUNTIME_RESERVE, row: str = "sample") -> list[dict]:  # fmt: skip
    """Every (GPU, requests) row, GPU by GPU."""
    return [plan_row(g, n, model, canvas_length, reserve_bytes, row) for g in gpus for n in requests]


def zerogpu_size(model: ModelSpec, reserve_bytes: int = RUNTIME_RESERVE) -> str | None:
    """The smallest ZeroGPU workload (`large`, then `xlarge`) that holds the weights, the reserve
    and the sampler step of at least one request (the planner tiles any batch into what is left);
    None where not even `xlarge` does."""
    return next((gpu.zerogpu_size for gpu in ZEROGPU_SIZES
                 if plan_row(gpu, 1, model, reserve_bytes=reserve_bytes)["tile_size"] is not None), None)


def summary(rows: list[dict], model: ModelSpec, seconds: float) -> dict:
    """The closing line: the model, the copies per request each step holds, what fits where."""
    cl, vocab, hidden = rows[0]["canvas_length"], model.vocab_size, model.hidden_size
    chunks = sorted({r["chunk_size"] for r in rows if r["chunk_size"]})
    facts = model_facts(model, 1, cl)
    chunked = {c: calibration_for(facts, impl="chunked", chunk=c).copies_per_request for c in chunks}
    return dict(
        summary=True, model=model.name, weights_bytes=model.weights_bytes, reserve_bytes=rows[0]["reserve_bytes"],
        canvas_length=cl, vocab=vocab, hidden=hidden, fraction=FRACTION,
        copies_per_request=dict(
            untiled=round(untiled_calibration(cl, vocab, hidden).copies_per_request, 3), seed_assumed=SEED_COPIES,
            tiled=round(calibration_for(facts).copies_per_request, 3),
            chunked={str(c): round(v, 4) for c, v in chunked.items()},
            tiled_by_row={kind: round(calibration_for(facts, kind=kind).copies_per_request, 3) for kind in COSTLIEST},
        ),
        gpus_fitting_weights=sorted({r["gpu"] for r in rows if r["fits_weights"]}),
        zerogpu_size=zerogpu_size(model, rows[0]["reserve_bytes"]),
        rows=len(rows), seconds=round(seconds, 2),
    )  # fmt: skip


# --------------------------------------------------------------------------- models


class PlanError(ValueError):
    """Bad input to the plan: one sentence for the user."""


def model_from_facts(facts: dict) -> ModelSpec:
    """The model a server has loaded, from its facts (`LoadedModel.facts()`, the /info endpoint's
    source), its weights counted in bf16."""
    return ModelSpec(facts["model"], facts["parameters"] * 2, facts["canvas_length"], facts["vocab_size"],
                     facts["hidden_size"], facts.get("softcap"))


def resolve_model(name: str | None) -> ModelSpec:
    """None or the released id: its published size; a local checkpoint directory: the shapes of its
    DiffusionGemmaConfig, its weights estimated in bf16 (meta, no memory).

    Never downloads: a hub id is read from the local Hugging Face cache or refused.
    """
    if name is None or name == RELEASED_ID:
        return RELEASED
    from transformers import AutoConfig

    from dgemma.model.loading import HUB_ID, estimate_weight_bytes

    path = Path(name).expanduser()
    if path.is_dir() and not (path / "config.json").is_file():
        raise PlanError(f"{name} holds no config.json: pass a checkpoint directory")
    if not path.is_dir() and not HUB_ID.match(name):
        raise PlanError(f"no checkpoint directory at {name}")
    try:
        config = AutoConfig.from_pretrained(str(path) if path.is_dir() else name, local_files_only=True)
    except (OSError, ValueError):
        raise PlanError(f"{name} is neither a checkpoint directory nor in the local Hugging Face cache, "
                        f"and the plan never downloads; pass a directory, or {RELEASED_ID} for the released size") from None
    if config.model_type != "diffusion_gemma":
        raise PlanError(f"{name} is a {config.model_type!r} model, not a DiffusionGemma checkpoint")
    text = config.get_text_config()
    return ModelSpec(name, estimate_weight_bytes(config, torch.bfloat16), int(config.canvas_length), int(text.vocab_size),
                     int(text.hidden_size), getattr(text, "final_logit_softcapping", None))


# --------------------------------------------------------------------------- the command


def gpu_arg(text: str) -> Gpu:
    gpu = next((gpu for gpu in GPUS if text.lower() == gpu.key), None)
    if gpu is not None:
        return gpu
    raise argparse.ArgumentTypeError(f"unknown GPU {text!r}: choose from {', '.join(g.key for g in GPUS)}")


def _gib(n: int | None) -> str:
    return "-" if n is None else f"{n / GiB:.2f}"


def _share(part: int, free: int) -> str:
    share = 100 * part / free
    return "under 1 % of free" if share < 1 else f"{share:.0f} % of free"


def plan_sentence(rows: Sequence[dict], model: str) -> str:
    """One sentence that reads the chart for one GPU's rows (requests ascending)."""
    if not rows:
        return "No rows to read."
    first, last = rows[0], rows[-1]
    gpu = first["gpu"]
    on = f"On {'an' if gpu[:1] in 'AEFHILMNORSX' else 'a'} {gpu}"
    if not first["fits_weights"]:
        return (f"{on} {model} does not fit in bf16: its weights take {format_bytes(first['weights_bytes'])} of "
                f"{format_bytes(first['gpu_bytes'])} (with a {format_bytes(first['reserve_bytes'])} reserve), so no "
                f"sampler runs; untiled, {last['requests']} requests would need "
                f"{format_bytes(last['untiled_peak_bytes'])} for the step alone.")
    free = first["free_bytes"]
    oom = next((r for r in rows if not r["fits_untiled"]), None)
    untiled = (f"untiled runs out of memory at {oom['requests']} requests (it needs {format_bytes(oom['untiled_peak_bytes'])})"
               if oom else f"untiled fits all {last['requests']} requests ({format_bytes(last['untiled_peak_bytes'])})")  # fmt: skip
    parts = [f"{on}, {format_bytes(free)} is free after the weights of {model} and the reserve: {untiled}",
             f"the seed's heuristic runs groups of {last['seed_group']} (peak {format_bytes(last['seed_peak_bytes'])}, "
             f"{_share(last['seed_peak_bytes'], free)})"]  # fmt: skip
    if last["tile_size"] is not None:
        parts.append(f"calibrated tiling runs tiles of {last['tile_size']} (peak {format_bytes(last['tiled_peak_bytes'])}, "
                     f"{_share(last['tiled_peak_bytes'], free)})")  # fmt: skip
    if last["chunked_peak_bytes"] is not None:
        held = "in one tile" if last["chunked_tiles"] == 1 else f"in tiles of {last['chunked_tile_size']}"
        parts.append(f"the chunked step runs {last['requests']} requests {held} at {format_bytes(last['chunked_peak_bytes'])}")
    return "; ".join(parts[:-1]) + (", and " if len(parts) > 1 else "") + parts[-1] + "."


def main(argv: list[str] | None = None) -> int:
    started = time.time()
    parser = ArgumentParser(prog="python -m dgemma.plan", description=__doc__.splitlines()[0])
    parser.add_argument("--model", help=f"checkpoint directory or hub id in the local cache (default: {RELEASED_ID}, "
                        "by its published size)")  # fmt: skip
    parser.add_argument("--gpus", nargs="+", type=gpu_arg, default=list(GPUS), metavar="GPU",
                        help=f"of {', '.join(g.key for g in GPUS)} (default: all)")  # fmt: skip
    parser.add_argument("--requests", nargs="+", type=positive_int, default=list(REQUESTS), metavar="N")
    parser.add_argument("--canvas-length", type=positive_int, default=None, help="default: the model's (256 released)")
    parser.add_argument("--reserve", type=size_arg, default=RUNTIME_RESERVE,
                        help="memory held back from every GPU before the sampler (default 2GiB)")  # fmt: skip
    parser.add_argument("--json", action="store_true", help="one JSON line per row, then a summary line")
    args = parser.parse_args(argv)
    try:
        model = resolve_model(args.model)
    except PlanError as err:
        parser.error(str(err))
    rows = plan_rows(model, tuple(args.gpus), tuple(args.requests), args.canvas_length, args.reserve)
    closing = summary(rows, model, time.time() - started)
    if args.json:
        for row in rows:
            print(json.dumps(row))
        print(json.dumps(closing))
        return 0
    print(f"{model.name}: weights {format_bytes(model.weights_bytes)} (bf16), reserve {format_bytes(args.reserve)}, "
          f"canvas {rows[0]['canvas_length']}, vocab {model.vocab_size:,}; GiB; ! = untiled runs out of memory")  # fmt: skip
    print(f"{'gpu':<20} {'reqs':>4} {'free':>8} {'untiled':>10} {'seed':>5} {'seed pk':>9} {'tiles':>7} "
          f"{'tiled pk':>9} {'chunked':>9}")  # fmt: skip
    for r in rows:
        tiled = "-" if r["tile_size"] is None else f"{r['tiles']}x{r['tile_size']}"
        print(f"{r['gpu']:<20} {r['requests']:>4} {_gib(r['free_bytes']):>8} {_gib(r['untiled_peak_bytes']):>9}"
              f"{'' if r['fits_untiled'] else '!':<1} {r['seed_group']:>5} {_gib(r['seed_peak_bytes']):>9} "
              f"{tiled:>7} {_gib(r['tiled_peak_bytes']):>9} {_gib(r['chunked_peak_bytes']):>9}")  # fmt: skip
    for gpu in args.gpus:  # each GPU's rows read in one sentence, as the lesson's explorer reads them
        print(plan_sentence([r for r in rows if r["gpu"] == gpu.label], model.name))
    copies = closing["copies_per_request"]
    chunked = ", ".join(f"{v} (chunk {c})" for c, v in copies["chunked"].items()) or "-"
    print(f"copies per request: untiled {copies['untiled']}, seed assumes {copies['seed_assumed']}, tiled "
          f"{copies['tiled']}, chunked {chunked}; {closing['seconds']} s")  # fmt: skip
    rows_ = copies["tiled_by_row"]
    print(f"tiled, by scheduler: entropy bound (and block refinement or DDIM at temperature 0) {rows_['sample']}, "
          f"block refinement or DDIM at a temperature {rows_['tempered']}, a DDIM corrector sweep {rows_['sweep']}")
    size = closing["zerogpu_size"]
    print(f"on ZeroGPU: spaces.GPU(size={size!r}) holds it" if size else "on ZeroGPU: no workload size holds it")
    return 0


if __name__ == "__main__":
    run_cli(main)
