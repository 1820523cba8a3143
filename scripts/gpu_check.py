"""What matters on a real GPU, measured in one short run: `python scripts/gpu_check.py`.

Builds a random-weight DiffusionGemma with the released checkpoint's widths (hidden size, heads,
head dims, 128 experts top-8, vocab 262,144, canvas 256) but only two layers (one sliding, one
full attention), about 5 GB in bf16, so it fits any 16 GB GPU; saves it with `save_pretrained`
and prints one JSON line per measurement:

- load: `load_model` in a fresh process (straight to the GPU through `device_map`): seconds and
  peak host RSS, next to the weights' size (a full host copy first would show RSS above it);
- sampler, 16 and 32 requests: untiled ("off") vs tiled ("auto") peak `torch.cuda.max_memory_allocated`,
  copies per request measured vs calibrated, and the chunked step's peak; the fraction of tokens
  tiled == untiled == chunked (1.0 where the kernels are exact), and whether the soft embeddings
  of tiles of one request are untiled's bit for bit;
- tile size: the planner's group for 32 requests vs what the calibrated transient says fits in half
  of this GPU's free memory;
- engine: canvas tokens per second on the engine vs transformers' `generate` on the same model.

Without CUDA it prints one line saying so and exits 0. `--config` takes the release's config.json
when one is at hand (the built-in widths are `dgemma/model/release.py`'s). `scripts/gpu_fullsize.py`
measures the release at full depth with `--load-format dummy` instead of a written checkpoint.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dgemma.model.release import RELEASE_CANVAS as CANVAS, RELEASE_TEXT  # noqa: E402


def emit(**fields) -> None:
    print(json.dumps(fields), flush=True)


def build_checkpoint(path: Path, text: dict, layers: int, canvas: int) -> None:
    """A random-weight checkpoint of the given widths, written in bf16 with a tokenizer."""
    import torch

    from dgemma.model.dummy import build_random_model
    from dgemma.model.release import release_config, write_config_dir

    config = release_config(layers, canvas, **text)
    model = build_random_model(config, "cuda" if torch.cuda.is_available() else "cpu", torch.bfloat16)
    model.save_pretrained(str(path))
    del model
    write_config_dir(path, config)  # the config again, and a tokenizer of its vocabulary


def measure_load(path: str, device: str) -> None:
    """Run in a fresh process: the load's time and the process's peak host RSS."""
    from dgemma.model.loading import load_model

    started = time.monotonic()
    loaded = load_model(path, device=device)
    seconds = time.monotonic() - started
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    emit(measure="load", seconds=round(seconds, 2), peak_host_rss_bytes=rss, weight_bytes=loaded.weight_bytes,
         device=str(loaded.device), dtype=str(loaded.dtype))


def sampler_rows(loaded, n: int) -> None:
    """One step of n requests: reference untiled, tiled (auto) and in tiles of one, chunked (auto);
    the tokens and soft embeddings of each against untiled's (cuBLAS picks kernels by the row count
    too: a tile of one request is the fewest rows a product gets)."""
    import torch

    from dgemma.memory import CudaMemory
    from dgemma.model.runner import Runner
    from dgemma.sampling import LMHead, SamplerConfig, SamplingParams, TiledSampler

    device, cl, vocab = loaded.device, loaded.canvas_length, loaded.vocab_size
    runner = Runner(loaded.model)
    head = LMHead(runner.model.lm_head.weight, loaded.model.final_logit_softcapping)
    gen = torch.Generator(device=device).manual_seed(n)
    hidden = torch.randn(n, cl, loaded.hidden_size, generator=gen, device=device, dtype=loaded.dtype) * 4
    per_copy = cl * vocab * 4
    states = {}
    for impl, tiling in (("reference", "off"), ("reference", "auto"), ("reference", 1), ("chunked", "auto")):
        sampler = TiledSampler(SamplerConfig(n, cl, vocab, loaded.embed_weight, loaded.embed_scale, memory=CudaMemory(device),
                                             tiling=tiling, impl=impl, lm_head=head if impl == "chunked" else None))
        for slot in range(n):
            sampler.start_canvas(slot, SamplingParams(seed=1000 + slot), 0)
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        started = time.perf_counter()
        try:
            if impl == "chunked":
                out = sampler.step(None, list(range(n)), hidden=hidden)
            else:
                out = sampler.step(runner.lm_logits(hidden), list(range(n)))
            torch.cuda.synchronize(device)
        except torch.OutOfMemoryError as err:
            emit(measure="sampler", requests=n, impl=impl, tiling=tiling, out_of_memory=str(err).splitlines()[0][:200])
            continue
        plan = out.plan
        peak = torch.cuda.max_memory_allocated(device) - base
        states[(impl, tiling)] = (sampler.draft[:n].clone(), sampler.soft[:n].clone())
        emit(measure="sampler", requests=n, impl=impl, tiling=tiling, tiles=list(plan.tiles),
             peak_allocated_bytes=int(peak), seconds=round(time.perf_counter() - started, 4),
             copies_per_request_measured=round(plan.peak_transient_bytes / (max(plan.tiles) * per_copy), 3),
             copies_per_request_calibrated=round(plan.bytes_per_request / per_copy, 3))
        del sampler, out
        torch.cuda.empty_cache()
    base = states.get(("reference", "off"))
    for key, (draft, soft) in states.items():
        if base is not None and key != ("reference", "off"):
            emit(measure="tokens_equal", requests=n, impl=key[0], tiling=key[1], vs="reference/off",
                 fraction_equal=round(float((draft == base[0]).float().mean()), 6), exact=bool(torch.equal(draft, base[0])),
                 soft_exact=bool(torch.equal(soft, base[1])))


def tile_size(loaded, n: int = 32) -> None:
    """The planner's group for n requests vs the calibrated transient against half the free memory."""
    from dgemma.memory import CudaMemory, plan_tiles
    from dgemma.sampling import SamplerConfig, TiledSampler

    memory = CudaMemory(loaded.device)
    sampler = TiledSampler(SamplerConfig(n, loaded.canvas_length, loaded.vocab_size, loaded.embed_weight, loaded.embed_scale,
                                         memory=memory))
    calibration = sampler.calibration()
    free = memory.free_bytes()
    emit(measure="tile_size", requests=n, free_bytes=int(free), planned_group=plan_tiles(n, free, calibration),
         calibrated_fit=int((free * 0.5 - calibration.fixed_bytes) // calibration.bytes_per_request),
         bytes_per_request=calibration.bytes_per_request)


def engine_vs_generate(path: str, requests: int, steps: int) -> None:
    """Canvas tokens per second: the engine vs transformers' generate, one canvas per request."""
    from dgemma.bench.engine import Baseline, run_batch
    from dgemma.engine import Engine, EngineConfig
    from dgemma.model.loading import load_model
    from dgemma.sampling import SamplingParams
    from transformers.models.diffusion_gemma.generation_diffusion_gemma import EntropyBoundSamplerConfig

    engine_model = load_model(path, device="cuda")
    baseline_model = load_model(path, device="cuda")  # untouched: the engine patches its own copy
    params = [SamplingParams(max_denoising_steps=steps, seed=i) for i in range(requests)]
    p = params[0]
    settings = dict(max_denoising_steps=steps, t_min=p.t_min, t_max=p.t_max, stability_threshold=p.stability_threshold,
                    confidence_threshold=p.confidence_threshold,
                    sampler_config=EntropyBoundSamplerConfig(entropy_bound=float(p.entropy_bound)))
    baseline = Baseline(baseline_model, settings, CANVAS)
    prompts = [f"Question {i}: why is the sky blue?" for i in range(requests)]
    with Engine(engine_model, EngineConfig(max_num_seqs=requests)) as engine:
        engine.run_until_done(prompts[:2], params[:2], CANVAS)  # warm-up: calibration, first allocations
        result = run_batch(engine, baseline, prompts, params, CANVAS, repeat=1)
    emit(measure="engine_vs_generate", **result)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="scripts/gpu_check.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--config", help="the release's config.json, for its exact widths (default: built in)")
    p.add_argument("--layers", type=int, default=2, help="layers of the random model (default 2)")
    p.add_argument("--requests", type=int, default=32, help="requests for the engine comparison (default 32)")
    p.add_argument("--steps", type=int, default=8, help="denoising steps per canvas (default 8)")
    p.add_argument("--dir", help="where to write the checkpoint (default: a temporary directory)")
    p.add_argument("--load-only", help=argparse.SUPPRESS)  # the fresh process that measures the load
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    if args.load_only:
        measure_load(args.load_only, "cuda")
        return 0
    if not torch.cuda.is_available():
        emit(measure="skipped", reason="no CUDA device on this machine: nothing to measure (run it on a GPU)")
        return 0
    text = dict(RELEASE_TEXT)
    if args.config:
        text.update({k: v for k, v in json.loads(Path(args.config).read_text())["text_config"].items() if k in text})
    emit(measure="device", name=torch.cuda.get_device_name(), total_bytes=torch.cuda.get_device_properties(0).total_memory,
         torch=torch.__version__, widths=text, layers=args.layers)
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        path = Path(tmp) / "model"
        started = time.monotonic()
        build_checkpoint(path, text, args.layers, CANVAS)
        torch.cuda.empty_cache()
        emit(measure="build", seconds=round(time.monotonic() - started, 1))
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        subprocess.run([sys.executable, __file__, "--load-only", str(path)], check=True, env=env)

        from dgemma.model.loading import load_model

        loaded = load_model(str(path), device="cuda")
        for n in (16, 32):
            sampler_rows(loaded, n)
        tile_size(loaded)
        del loaded
        torch.cuda.empty_cache()
        engine_vs_generate(str(path), args.requests, args.steps)
    return 0


if __name__ == "__main__":
    sys.exit(main())
