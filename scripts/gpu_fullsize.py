"""The app at the released model's full size, random weights, measured in parts:

    python scripts/gpu_fullsize.py PART --dir CONFIG_DIR [--toy] [--device cuda]

PART is one of (each a fresh process under its own time limit in scripts/gpu_session.sh):
- build: the release's config (30 layers, `dgemma/model/release.py`) written to CONFIG_DIR and
  loaded with `--load-format dummy`: build seconds, weight bytes, free memory after loading;
- engine: 32 prompts x 256 new tokens (`max_denoising_steps` 8) through the engine, the experts per
  canvas and whole batch, the sampler step eager and compiled: seconds per step, the decoder's and
  the sampler's shares, canvas tokens per second, tokens per forward, the tile plans, the peak
  allocated, and the fraction of tokens equal to the first mode's; then the same prompts through
  transformers' `generate` on the same weights, side by side;
- lesson: the sampler at the device's real free memory with the weights resident: the request
  count the planner names as the first that cannot fit untiled, untiled at that count (out of
  memory expected) and tiled (completes), and the tiled tokens against untiled ones of a count
  that fits (keyed noise: a request's tokens never depend on its batch-mates);
- app: `python app.py --model CONFIG_DIR --load-format dummy` served, the prompts sent through
  `/generate` by a gradio_client (its summary and tile plans), then the Generate tab's streaming
  endpoint: the updates per second a streaming client receives.

One JSON line per figure on stdout. `--toy` is the suite's dry run (tests/test_gpu_session.py): a
two-layer model of small widths on the CPU, 4 prompts, one canvas, 2 steps.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TOY_TEXT = dict(vocab_size=4096, hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_attention_heads=4,
                num_key_value_heads=2, head_dim=16, global_head_dim=32, num_global_key_value_heads=1, num_experts=16,
                top_k_experts=2, sliding_window=32)  # fmt: skip
PROMPTS = ["Why is the sky blue?", "Write a short poem about rain.", "How do you explain a poem?", "What is the sky?"]
COMPILE_ENV = "DGEMMA_COMPILE_SAMPLER"


def emit(figure: str, **fields) -> None:
    print(json.dumps({"figure": figure, **fields}), flush=True)


def sizes(args) -> dict:
    """Requests, new tokens and steps: the issue's 32 x 256 x 8, or the dry run's."""
    return dict(requests=4, new_tokens=16, steps=2) if args.toy else dict(requests=32, new_tokens=256, steps=8)


def config_dir(args) -> str:
    from dgemma.model.release import release_config, write_config_dir

    path = Path(args.dir)
    if not (path / "config.json").is_file():
        config = release_config(2, 16, **TOY_TEXT) if args.toy else release_config()
        write_config_dir(path, config)
    return str(path)


def load(args):
    from dgemma.model.loading import load_model

    return load_model(config_dir(args), device=args.device, load_format="dummy")


def free_bytes(device) -> int:
    import torch

    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    import psutil

    return int(psutil.virtual_memory().available)


def peak_reset(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)


def peak_allocated(device) -> int | None:
    import torch

    return int(torch.cuda.max_memory_allocated(device)) if device.type == "cuda" else None


def part_build(args) -> None:
    started = time.perf_counter()
    loaded = load(args)
    if loaded.device.type == "cuda":
        import torch

        torch.cuda.synchronize(loaded.device)
    text = loaded.model.config.text_config
    emit("build", seconds=round(time.perf_counter() - started, 2), weight_bytes=loaded.weight_bytes,
         free_bytes_after_load=free_bytes(loaded.device), layers=text.num_hidden_layers, experts=text.num_experts,
         parameters=loaded.facts()["parameters"], dtype=loaded.facts()["dtype"], device=str(loaded.device))


def engine_run(loaded, prompts, params, new_tokens: int) -> tuple[dict, list]:
    """One batch through a fresh engine, after a warm-up (compiles, calibrations, first allocations)."""
    from dgemma.engine import Engine, EngineConfig
    from dgemma.events import TilePlan
    from dgemma.metrics import run_summary

    with Engine(loaded, EngineConfig(max_num_seqs=len(prompts))) as engine:
        engine.run_until_done(prompts[:2], params[:2], min(new_tokens, loaded.canvas_length))
        mailbox = engine.subscribe(coalesce=False)
        before = dict(engine.stats)
        peak_reset(loaded.device)
        started = time.perf_counter()
        finals = engine.run_until_done(prompts, params, new_tokens)
        wall = time.perf_counter() - started
        plans = [e for e in mailbox.poll(0.0) if isinstance(e, TilePlan)]
        steps = engine.stats["steps"] - before["steps"]
    failed = [f for f in finals if f.status != "done"]
    if failed:
        raise RuntimeError(f"{len(failed)} requests failed, first: {failed[0].error}")
    summary = run_summary([f.extra.get("metrics") for f in finals], wall)
    canvas_tokens = sum(f.canvases for f in finals) * loaded.canvas_length
    return dict(
        seconds=round(wall, 3), steps=steps, seconds_per_step=round(wall / max(steps, 1), 4),
        decoder_share=summary.get("decoder_share"), sampler_share=summary.get("sampler_share"),
        canvas_tokens_per_s=round(canvas_tokens / wall, 1), tokens_per_forward=summary.get("tokens_per_forward"),
        tile_plans={"+".join(map(str, k)): n for k, n in Counter(p.tiles for p in plans).items()},
        peak_allocated_bytes=peak_allocated(loaded.device),
    ), [f.token_ids for f in finals]


def part_engine(args) -> None:
    from dgemma.bench.engine import Baseline
    from dgemma.model.runner import EXPERT_MODES, set_experts_mode
    from dgemma.sampling import SamplingParams
    from transformers.models.diffusion_gemma.generation_diffusion_gemma import EntropyBoundSamplerConfig

    size = sizes(args)
    loaded = load(args)
    prompts = [PROMPTS[i % len(PROMPTS)] + f" ({i})" for i in range(size["requests"])]
    params = [SamplingParams(max_denoising_steps=size["steps"], seed=i) for i in range(len(prompts))]
    first: list = []

    def run(experts: str, compiled: str) -> None:
        os.environ[COMPILE_ENV] = "on" if compiled == "compiled" else "off"
        set_experts_mode(loaded.model, experts)
        row, tokens = engine_run(loaded, prompts, params, size["new_tokens"])
        first[:] = first or tokens
        same = [a == b for a, b in zip(tokens, first)]
        equal = sum(x == y for a, b in zip(tokens, first) for x, y in zip(a, b)) / max(1, sum(map(len, first)))
        emit("engine", experts=experts, sampler=compiled, requests=len(prompts), new_tokens=size["new_tokens"],
             max_denoising_steps=size["steps"], **row, requests_equal_to_first=sum(same),
             token_fraction_equal_to_first=round(equal, 4))

    # Eager rows and generate first: a compile that runs long (the part's limit) leaves them printed.
    for experts in EXPERT_MODES:
        run(experts, "eager")
    p = params[0]
    settings = dict(max_denoising_steps=size["steps"], t_min=p.t_min, t_max=p.t_max,
                    stability_threshold=p.stability_threshold, confidence_threshold=p.confidence_threshold,
                    sampler_config=EntropyBoundSamplerConfig(entropy_bound=float(p.entropy_bound)))
    os.environ[COMPILE_ENV] = "off"
    baseline = Baseline(loaded, settings, size["new_tokens"])  # the engine's patches fall back to the model's own
    baseline.run(prompts[:2])
    peak_reset(loaded.device)
    started = time.perf_counter()
    canvases = baseline.run(prompts)
    wall = time.perf_counter() - started
    emit("generate", requests=len(prompts), seconds=round(wall, 3),
         canvas_tokens_per_s=round(canvases * loaded.canvas_length / wall, 1), peak_allocated_bytes=peak_allocated(loaded.device))
    if loaded.device.type == "cuda" or args.compile:  # a CPU compiles for minutes: eager only there
        for experts in reversed(EXPERT_MODES):  # the CUDA default first
            run(experts, "compiled")
    os.environ.pop(COMPILE_ENV, None)


def part_lesson(args) -> None:
    import torch

    from dgemma.memory import memory_for
    from dgemma.sampling import LMHead, SamplerConfig, SamplingParams, TiledSampler

    loaded = load(args)
    device, cl, vocab = loaded.device, loaded.canvas_length, loaded.vocab_size
    head = LMHead(loaded.model.lm_head.weight, loaded.model.final_logit_softcapping)
    budget = None if device.type == "cuda" else loaded.weight_bytes + 8 * cl * vocab * 4  # a CPU: a virtual device
    memory = memory_for(device, budget)
    if budget is not None:
        memory.reserve(loaded.weight_bytes, "the model weights")

    def sampler(n: int, tiling, compiled: bool = False):
        built = TiledSampler(SamplerConfig(n, cl, vocab, loaded.embed_weight, loaded.embed_scale, memory=memory,
                                           tiling=tiling, lm_head=head, compiled=compiled))
        for slot in range(n):
            built.start_canvas(slot, SamplingParams(seed=100 + slot), 0)
        return built

    calibration = sampler(1, "off").calibration()
    free = memory.free_bytes()
    n = 1
    while calibration.tile_bytes(n) <= free:  # the first count whose untiled step cannot fit
        n += 1
    gen = torch.Generator(device=device).manual_seed(0)
    hidden = torch.randn(n, cl, loaded.hidden_size, generator=gen, device=device, dtype=loaded.dtype) * 4
    rows = {}
    for tiling in ("off", "auto"):
        built = sampler(n, tiling)
        peak_reset(device)
        started = time.perf_counter()
        try:
            out = built.step(None, list(range(n)), hidden=hidden)
            rows[tiling] = built.draft[:n].clone()
            emit("lesson", requests=n, tiling=tiling, outcome="completed", tiles=list(out.plan.tiles),
                 seconds=round(time.perf_counter() - started, 3), peak_allocated_bytes=peak_allocated(device))
        except torch.OutOfMemoryError as err:
            emit("lesson", requests=n, tiling=tiling, outcome="out of memory", message=str(err).splitlines()[0][:160])
        del built
        if device.type == "cuda":
            torch.cuda.empty_cache()
    fits = max(1, n // 2)
    small = sampler(fits, "off")
    small.step(None, list(range(fits)), hidden=hidden[:fits])
    tiled = rows.get("auto")
    emit("lesson_tokens", requests_named_by_planner=n, free_bytes=int(free), compared=fits,
         tiled_equal_to_untiled=bool(tiled is not None and torch.equal(tiled[:fits], small.draft[:fits])))
    if device.type == "cuda" or args.compile:  # the compiled step, tiled and untiled, against eager's tokens
        for tiling, count, eager in (("auto", n, tiled), ("off", fits, small.draft[:fits])):
            built = sampler(count, tiling, compiled=True)
            built.step(None, list(range(count)), hidden=hidden[:count])  # compiles
            started = time.perf_counter()
            built.step(None, list(range(count)), hidden=hidden[:count])
            seconds = time.perf_counter() - started
            again = sampler(count, tiling, compiled=True)  # a fresh one for the tokens: the first step of each canvas
            again.step(None, list(range(count)), hidden=hidden[:count])
            same = float((again.draft[:count] == eager[:count]).float().mean()) if eager is not None else None
            emit("lesson_compiled", requests=count, tiling=tiling, seconds_second_step=round(seconds, 4),
                 token_fraction_equal_to_eager=same)
            del built, again


def part_app(args) -> None:
    import socket


    size = sizes(args)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    command = [sys.executable, str(ROOT / "app.py"), "--model", config_dir(args), "--load-format", "dummy",
               "--device", args.device, "--port", str(port), "--max-num-seqs", str(size["requests"])]
    server = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        url = f"http://127.0.0.1:{port}/"
        client = wait_for(url, server)
        started = time.perf_counter()
        while not isinstance(client.predict(api_name="/info").get("vocab_size"), int):  # the page is served first
            time.sleep(1)
        emit("app_ready", seconds_after_page=round(time.perf_counter() - started, 1))
        prompts = [PROMPTS[i % len(PROMPTS)] + f" ({i})" for i in range(size["requests"])]
        settings = {"seed": 0, "max_new_tokens": size["new_tokens"], "max_denoising_steps": size["steps"]}
        client.predict(prompts[:2], {**settings, "max_new_tokens": 8}, api_name="/generate")  # warm-up
        started = time.perf_counter()
        result = client.predict(prompts, settings, api_name="/generate")
        wall = time.perf_counter() - started
        info = client.predict(api_name="/info")
        summary = result.get("summary", {})
        emit("app_generate", requests=len(prompts), seconds=round(wall, 3), weights=info.get("weights"),
             experts=info.get("experts"), summary=summary,
             tile_plans=Counter("+".join(map(str, p.get("tiles", []))) for p in result.get("tile_plans", [])))
        sys.path.insert(0, str(ROOT / "scripts"))
        from measure_app import measure_stream

        emit("app_stream", **measure_stream(url, len(prompts), size["new_tokens"], size["steps"]))
    finally:
        server.terminate()
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()


def wait_for(url: str, server: subprocess.Popen, timeout: float = 300.0):
    from gradio_client import Client

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"app.py exited {server.returncode}: {(server.stderr.read() or '')[-500:]}")
        try:
            return Client(url, verbose=False)
        except Exception:  # noqa: BLE001 - not serving yet
            time.sleep(1)
    raise RuntimeError(f"app.py did not serve {url} within {timeout:.0f} s")


PARTS = {"build": part_build, "engine": part_engine, "lesson": part_lesson, "app": part_app}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="scripts/gpu_fullsize.py", description=__doc__.split("\n\n")[0])
    p.add_argument("part", choices=list(PARTS))
    p.add_argument("--dir", required=True, help="the config directory (written if it holds no config.json)")
    p.add_argument("--device", default="cuda", help="cuda (default) or cpu (the dry run)")
    p.add_argument("--toy", action="store_true", help="the suite's dry run: small widths, 4 prompts")
    p.add_argument("--compile", action="store_true", help="also compile the sampler step on a CPU (slow to compile)")
    args = p.parse_args(argv)
    import torch

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        emit("skipped", part=args.part, reason="no CUDA device on this machine (pass --device cpu --toy for the dry run)")
        return 0
    PARTS[args.part](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
