"""`python -m dgemma.bench decoder`: the decoder's seconds per step, experts per canvas vs whole batch.

A random-weight model of the release's widths (one layer by default) is built on the device, n
prompts are prefilled, and one decoder call over n canvases is timed, alternated after a warm-up, in:

- per_canvas: the runner's batch-invariant mode, the model's experts called once per canvas;
- whole_batch: one call of the model's experts over every canvas's tokens;
- eager: the model's eager per-expert loop (transformers' reference), over the whole batch.

Printed per row: the median seconds, the ratio to per_canvas, and whether the hidden states equal
per_canvas's bit for bit (else their largest difference). The vocabulary only sizes the embedding,
so a CPU may pass a smaller one. On a CPU the header says whether MKL's strict mode holds (Intel
only; where not, whole batch and eager may differ in the last bits: `dgemma/reproducible.py`).
"""

from __future__ import annotations

import statistics
import time

import torch

from dgemma.bench import print_row, sync, timed
from dgemma.cli import ArgumentParser, positive_int
from dgemma.reproducible import mkl_strict_mode_holds

MODES = ("per_canvas", "whole_batch", "eager")


def build_parser(prog: str = "python -m dgemma.bench decoder") -> ArgumentParser:
    from dgemma.model.release import RELEASE_CANVAS, RELEASE_TEXT

    p = ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="auto", help="cpu, cuda or auto (default)")
    p.add_argument("--dtype", default="auto", help="auto (bf16 on CUDA, fp32 on CPU), bfloat16, float16, float32")
    p.add_argument("--canvases", type=positive_int, nargs="+", default=[4, 32], help="canvases per call (default 4 32)")
    p.add_argument("--layers", type=positive_int, default=1, help="decoder layers (default 1)")
    p.add_argument("--experts", type=positive_int, default=RELEASE_TEXT["num_experts"], help="experts per layer (default 128)")
    p.add_argument("--top-k", type=positive_int, default=RELEASE_TEXT["top_k_experts"], help="experts per token (default 8)")
    p.add_argument("--hidden", type=positive_int, default=RELEASE_TEXT["hidden_size"], help="hidden size (default 2816)")
    p.add_argument("--moe-intermediate", type=positive_int, default=RELEASE_TEXT["moe_intermediate_size"],
                   help="an expert's intermediate size (default 704)")
    p.add_argument("--intermediate", type=positive_int, default=RELEASE_TEXT["intermediate_size"],
                   help="the dense MLP's intermediate size (default 2112)")
    p.add_argument("--heads", type=positive_int, default=RELEASE_TEXT["num_attention_heads"], help="attention heads (default 16)")
    p.add_argument("--head-dim", type=positive_int, default=RELEASE_TEXT["head_dim"], help="head size (default 256)")
    p.add_argument("--vocab", type=positive_int, default=RELEASE_TEXT["vocab_size"], help="vocabulary (default 262,144)")
    p.add_argument("--canvas-length", type=positive_int, default=RELEASE_CANVAS, help="canvas (default 256)")
    p.add_argument("--prompt-tokens", type=positive_int, default=64, help="each canvas's cache length (default 64)")
    p.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES, help="rows to time (default all)")
    p.add_argument("--repeats", type=positive_int, default=3, help="timed calls per row (median reported)")
    p.add_argument("--threads", type=positive_int, default=None, help="torch's intra-op threads (default: torch's own)")
    p.add_argument("--json", action="store_true", help="one JSON object per row")
    return p


def build_model(args, device: torch.device, dtype: torch.dtype):
    from dgemma.model.dummy import build_random_model
    from dgemma.model.release import release_config

    kv = max(1, args.heads // 2)
    config = release_config(
        args.layers, args.canvas_length, vocab_size=args.vocab, hidden_size=args.hidden,
        intermediate_size=args.intermediate, moe_intermediate_size=args.moe_intermediate,
        num_experts=args.experts, top_k_experts=args.top_k, num_attention_heads=args.heads,
        num_key_value_heads=kv, head_dim=args.head_dim, global_head_dim=2 * args.head_dim,
        num_global_key_value_heads=max(1, kv // 4),
    )  # fmt: skip
    return build_random_model(config, device, dtype)


def use_mode(model, mode: str) -> None:
    """per_canvas / whole_batch: the runner's modes over the model's own experts; eager: whole
    batch over the model's eager per-expert loop."""
    from dgemma.model.runner import set_experts_mode

    set_experts_mode(model, "per_canvas" if mode == "per_canvas" else "whole_batch")
    for layer in [*model.model.decoder.layers, *model.model.encoder.language_model.layers]:
        experts = layer.experts
        experts._dgemma_default_impl = getattr(experts, "_dgemma_default_impl", experts._dgemma_base_impl)
        experts._dgemma_base_impl = "eager" if mode == "eager" else experts._dgemma_default_impl


def rows_for(runner, model, n: int, args, device: torch.device) -> list[dict]:
    """Every mode's row at n canvases: alternated, after one untimed call each."""
    gen = torch.Generator().manual_seed(n)
    vocab, cl, hidden = args.vocab, args.canvas_length, args.hidden
    use_mode(model, "per_canvas")  # prefill is the same in every mode here: one prompt at a time
    caches = [runner.prefill([torch.randint(0, vocab, (args.prompt_tokens,), generator=gen).tolist()])[0] for _ in range(n)]
    canvases = torch.randint(0, vocab, (n, cl), generator=gen)
    soft = (torch.randn(n, cl, hidden, generator=gen) * 0.5).to(device, model.dtype)
    seconds: dict[str, list[float]] = {m: [] for m in args.modes}
    outputs: dict[str, torch.Tensor] = {}
    for round_ in range(-1, args.repeats):
        order = args.modes if round_ % 2 == 0 else list(reversed(args.modes))
        for mode in order:
            use_mode(model, mode)
            sync(device)
            started = time.perf_counter()
            out = runner.decode(canvases, soft, None, caches, hidden_only=True)
            sync(device)
            if round_ >= 0:
                seconds[mode].append(time.perf_counter() - started)
            outputs[mode] = out
    use_mode(model, "per_canvas")
    base = statistics.median(seconds["per_canvas"]) if "per_canvas" in seconds else None
    ref = outputs.get("per_canvas")
    rows = []
    for mode in args.modes:
        s = statistics.median(seconds[mode])
        row = dict(bench="decoder", canvases=n, mode=mode, seconds=round(s, 5), layers=args.layers,
                   experts=args.experts, top_k=args.top_k, hidden=args.hidden, canvas_length=cl,
                   device=str(device), dtype=str(model.dtype).removeprefix("torch."), threads=torch.get_num_threads(),
                   vs_per_canvas=round(s / base, 3) if base else None)
        if ref is not None:
            row["equal_to_per_canvas"] = bool(torch.equal(outputs[mode], ref))
            row["max_abs_diff"] = float((outputs[mode].float() - ref.float()).abs().max())
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    from dgemma.memory import resolve_device
    from dgemma.model.loading import parse_dtype
    from dgemma.model.runner import Runner

    args = build_parser().parse_args(argv)
    if args.top_k > args.experts:
        raise ValueError(f"--top-k {args.top_k} is more than --experts {args.experts}")
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    dtype = parse_dtype(None if args.dtype == "auto" else args.dtype, device)
    runner, built = timed(lambda: Runner(build_model(args, device, dtype)))
    model = runner.model
    if not args.json:
        strict = "" if device.type != "cpu" else (
            f"; MKL strict: {'yes' if mkl_strict_mode_holds() else 'no (MKL has it on Intel CPUs only)'}")
        print(f"decoder: {args.layers} layer(s), {args.experts} experts top-{args.top_k}, hidden {args.hidden}, "
              f"CL {args.canvas_length}, cache {args.prompt_tokens} tokens, {device} {str(dtype).removeprefix('torch.')}, "
              f"{torch.get_num_threads()} threads, built in {built:.1f} s; median of {args.repeats} decoder calls"
              f"{strict}")
        print(f"{'canvases':>8} {'mode':>12} {'s':>9} {'/per_canvas':>11} {'= per_canvas':>12} {'max diff':>9}")
    for n in args.canvases:
        for row in rows_for(runner, model, n, args, device):
            if args.json:
                print_row(row, True)
            else:
                print(f"{n:>8} {row['mode']:>12} {row['seconds']:>9.4f} {row['vs_per_canvas']:>11.3f} "
                      f"{str(row.get('equal_to_per_canvas')):>12} {row.get('max_abs_diff', 0):>9.2e}", flush=True)
    return 0
