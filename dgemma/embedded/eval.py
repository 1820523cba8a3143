"""`python -m dgemma.embedded.eval [--json]`: score a DiffusionGemma checkpoint on the held-out prompts.

Each implementation ("impl") is one function in `IMPLS` that turns a batch of prompts into
`Generation`s: the text plus, per canvas, how many denoising steps it took and whether the stopping
rule (stable and confident) fired before `max_denoising_steps`. Adding an implementation (the
project's engine) is adding one function there.

`--scheduler NAME` runs the engine's impls with that scheduler (sampling/schedulers/'s SCHEDULERS, at
its defaults; `--steps N` is `--max-denoising-steps N`): the quality-against-steps curve.

Figures per (impl, family): exact_match (checkable families), converged_fraction (canvases the
stopping rule ended before max steps; with DDIM's corrector sweeps, before its predictor steps),
mean_steps (decoder passes per canvas), and for prose
lexicon_fraction (share of generated words that belong to the grammar's lexicon).
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import torch
from transformers import AutoTokenizer, DiffusionGemmaForBlockDiffusion, PreTrainedTokenizerBase
from transformers.models.diffusion_gemma.generation_diffusion_gemma import (
    DiffusionGemmaGenerationConfig, EntropyBoundSamplerConfig, StableAndConfidentStoppingCriteria,
)  # fmt: skip

from dgemma.embedded import corpus
from dgemma.events import RequestEvent, Status
from dgemma.model.source import DEFAULT_MODEL
from dgemma.sampling.schedulers import SCHEDULERS

# The generation config's fields the CLI overrides and the engine's impls take by the same name
# (the entropy bound lives in its sampler_config).
OVERRIDES = ("max_denoising_steps", "t_min", "t_max", "confidence_threshold", "stability_threshold")


@dataclass(frozen=True)
class Canvas:
    steps: int  # decoder passes this canvas took
    converged: bool  # the stopping rule fired before max_denoising_steps


@dataclass(frozen=True)
class Generation:
    text: str  # the answer, decoded up to EOS
    canvases: tuple[Canvas, ...]  # the canvases up to and including the one holding EOS


# --- impl "transformers": the reference model.generate() ----------------------------------


class StoppingRuleRecorder:
    """A draft streamer that re-applies generate()'s own stopping rule to each step's logits.

    generate() hands a streamer with `_takes_logits` the processed logits of every denoising step,
    and freezes the logits of rows that have stopped; so the first step at which transformers'
    `StableAndConfidentStoppingCriteria` holds for a row is the step at which that row stopped.
    Each `put` (the prompt, then each committed canvas) starts a new canvas.
    """

    _takes_logits = True

    def __init__(self, config: DiffusionGemmaGenerationConfig):
        self.rule = StableAndConfidentStoppingCriteria(config.stability_threshold, config.confidence_threshold)
        self.fired_at: list[torch.Tensor] = []  # per canvas: [B] step the rule fired, 0 = never
        self._step = 0

    def put(self, value: torch.Tensor) -> None:
        self.rule.reset()
        self._step = 0
        self._current: torch.Tensor | None = None

    def put_draft(self, logits: torch.Tensor) -> None:
        self._step += 1
        if self._current is None:
            self._current = torch.zeros(logits.shape[0], dtype=torch.long)
            self.fired_at.append(self._current)
        fired = self.rule(logits.argmax(-1), logits).cpu()
        self._current[fired & (self._current == 0)] = self._step

    def end(self) -> None:
        pass


@lru_cache(maxsize=2)
def load_transformers(model_dir: Path) -> tuple[DiffusionGemmaForBlockDiffusion, PreTrainedTokenizerBase]:
    model = DiffusionGemmaForBlockDiffusion.from_pretrained(model_dir).eval()
    return model, AutoTokenizer.from_pretrained(model_dir)


def generate_transformers(model_dir: Path, prompts: list[str], config: DiffusionGemmaGenerationConfig,
                          seed: int) -> list[Generation]:
    model, tokenizer = load_transformers(model_dir)
    torch.manual_seed(seed)
    encoded = tokenizer(prompts, return_tensors="pt", padding=True)
    recorder = StoppingRuleRecorder(config)
    with torch.no_grad():
        sequences = model.generate(encoded.input_ids, attention_mask=encoded.attention_mask, generation_config=config,
                                   streamer=recorder).sequences
    new_tokens = sequences[:, encoded.input_ids.shape[1] :]
    canvas_length = model.config.canvas_length
    results = []
    for row, tokens in enumerate(new_tokens.tolist()):
        eos_at = tokens.index(config.eos_token_id) if config.eos_token_id in tokens else len(tokens)
        n_canvases = min(len(recorder.fired_at), eos_at // canvas_length + 1)
        fired = [int(recorder.fired_at[index][row]) for index in range(n_canvases)]
        steps = config.max_denoising_steps  # a canvas that never fired took them all (and did not converge)
        canvases = tuple(Canvas(fired_at or steps, 0 < fired_at < steps) for fired_at in fired)
        results.append(Generation(tokenizer.decode(tokens[:eos_at], skip_special_tokens=True), canvases))
    return results


# --- impl "engine": this project's engine and tiled sampler -------------------------------


def generate_engine(
    model_dir: Path, prompts: list[str], config: DiffusionGemmaGenerationConfig, seed: int, sampler: str = "reference",
    pins: list[dict[int, str]] | None = None, scheduler: str = "entropy_bound",
) -> list[Generation]:
    """The engine's generations with `scheduler`; `pins` (one {position: piece} per prompt) holds
    tokens of the first canvas."""
    # Imported here: the engine is another room, and the transformers impl must not depend on it.
    from dgemma.engine import Engine, EngineConfig
    from dgemma.model.loading import load_model
    from dgemma.sampling import SamplingParams
    from dgemma.sampling.schedulers import budget, scheduler_defaults
    from dgemma.settings import CanvasModel, Limits, Settings, make_request

    params = {key: getattr(config, key) for key in OVERRIDES}
    params.update(scheduler=scheduler_defaults(scheduler), entropy_bound=config.sampler_config.entropy_bound)
    loaded = load_model(str(model_dir), device="cpu", dtype=torch.float32)
    # The pins through the one door (dgemma/settings.py): each prompt's first canvas, resolved against the model.
    call = make_request(prompts, {"pins": pins}, Settings(SamplingParams(**params, seed=seed)), Limits(max_prompts=len(prompts)),
                        len(prompts), lambda: CanvasModel(loaded.canvas_length, loaded.encode_text))
    results = []
    with Engine(loaded, EngineConfig(max_num_seqs=len(prompts), sampler=sampler)).start() as engine:
        handles = [engine.submit(prompt, call.settings.params.for_prompt(i), config.max_new_tokens, stream_steps=False,
                                 start=call.canvas(i)) for i, prompt in enumerate(prompts)]
        predictor_budget = budget(SamplingParams(**params))[0]
        for handle in handles:
            # Committed and done events carry the running step counts: their differences are per-canvas steps
            # (forwards, and predictor steps: fewer by DDIM's corrector sweeps).
            events = [e for e in handle.events() if isinstance(e, RequestEvent) and e.status == Status.COMMITTED]
            final = handle.result()
            if final.status != Status.DONE:
                raise RuntimeError(f"engine request {handle.id} ended {final.status}: {final.error}")
            forwards, predicted = (per_canvas([*(pick(e) for e in events), pick(final)])
                                   for pick in (lambda e: e.steps, lambda e: e.extra["predictor_steps"]))  # fmt: skip
            canvases = tuple(Canvas(n, p < predictor_budget) for n, p in zip(forwards, predicted))
            results.append(Generation(final.text, canvases))
    return results


def per_canvas(totals: list[int]) -> list[int]:
    """Running totals -> each canvas's own count."""
    return [b - a for a, b in zip([0, *totals], totals)]


Impl = Callable[..., list[Generation]]
IMPLS: dict[str, Impl] = {
    "transformers": generate_transformers,
    "engine": generate_engine,  # the reference sampler step
    "engine-chunked": functools.partial(generate_engine, sampler="chunked"),  # LM head + step per vocab chunk
}


def mismatch_per_million(a: list[str], b: list[str]) -> dict:
    """Positions where two impls' outputs differ, per million generated characters (= tokens for the
    embedded model's character-level tokenizer); a length difference counts every extra position."""
    total = sum(max(len(x), len(y)) for x, y in zip(a, b))
    differing = sum(sum(p != q for p, q in zip(x, y)) + abs(len(x) - len(y)) for x, y in zip(a, b))
    return {"compared": total, "differing": differing, "per_million": round(1e6 * differing / max(1, total), 1)}


# --- scoring ------------------------------------------------------------------------------


def lexicon_fraction(texts: list[str]) -> float:
    generated = [word for text in texts for word in corpus.words(text)]
    return sum(word in corpus.LEXICON for word in generated) / max(1, len(generated))


def score_family(impl: str, family: str, examples: tuple[corpus.Example, ...], generations: list[Generation]) -> dict:
    canvases = [canvas for generation in generations for canvas in generation.canvases]
    row = {"impl": impl, "family": family, "n": len(examples), "exact_match": None,
           "converged_fraction": round(sum(c.converged for c in canvases) / max(1, len(canvases)), 4),
           "mean_steps": round(statistics.fmean(c.steps for c in canvases), 2) if canvases else None}
    if family in corpus.CHECKABLE:
        hits = sum(g.text == ex.answer for g, ex in zip(generations, examples))
        row["exact_match"] = round(hits / len(examples), 4)
    else:
        row["lexicon_fraction"] = round(lexicon_fraction([g.text for g in generations]), 4)
    return row


def summarize(rows: list[dict]) -> dict:
    """The figures averaged over families (exact match over the checkable ones only)."""

    def mean(key: str, rows_: list[dict]) -> float | None:
        values = [r[key] for r in rows_ if r.get(key) is not None]
        return round(statistics.fmean(values), 4) if values else None

    return {"impl": rows[0]["impl"], "n": sum(r["n"] for r in rows),
            "exact_match": mean("exact_match", [r for r in rows if r["family"] in corpus.CHECKABLE]),
            **{key: mean(key, rows) for key in ("converged_fraction", "mean_steps", "lexicon_fraction")}}


def evaluate(model_dir: Path, impl: str, families: list[str], n: int, config: DiffusionGemmaGenerationConfig,
             seed: int = 0, examples_shown: int = 0, scheduler: str = "entropy_bound") -> tuple[list[dict], list[str]]:
    """Per-family score rows, and every generated text in order (to compare impls)."""
    rows, texts = [], []
    generate = IMPLS[impl] if impl == "transformers" else functools.partial(IMPLS[impl], scheduler=scheduler)
    for family in families:
        examples = corpus.heldout(family, n)
        generations = generate(model_dir, [ex.prompt for ex in examples], config, seed)
        rows.append({"scheduler": scheduler, **score_family(impl, family, examples, generations)})
        texts += [g.text for g in generations]
        for ex, g in list(zip(examples, generations))[:examples_shown]:
            print(f"  {ex.prompt!r} -> {g.text!r}" + ("" if g.text == ex.answer else f"  (want {ex.answer!r})"))
    return rows, texts


# --- CLI ----------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m dgemma.embedded.eval", description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=Path(DEFAULT_MODEL), help="model directory (default: the embedded one)")
    parser.add_argument("--n", type=int, default=50, help=f"held-out prompts per family (1..{corpus.HELDOUT_POOL})")
    parser.add_argument("--impl", choices=[*IMPLS, "all"], default="transformers")
    parser.add_argument("--families", nargs="+", choices=list(corpus.FAMILIES), default=list(corpus.FAMILIES))
    parser.add_argument("--json", action="store_true", help="one JSON object per line")
    parser.add_argument("--seed", type=int, default=0, help="seed for the sampler's randomness")
    parser.add_argument("--show", type=int, default=0, help="print this many generations per family")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--pins", action="store_true", help="also run the engine with a right and a wrong token "
                        "pinned in each checkable answer (dgemma/embedded/pinned.py)")
    parser.add_argument("--scheduler", choices=SCHEDULERS, default="entropy_bound",
                        help="the engine's scheduler, at its defaults (transformers has the entropy bound only)")
    tuning = parser.add_argument_group("generation overrides (default: the model's generation_config.json)")
    tuning.add_argument("--max-denoising-steps", "--steps", dest="max_denoising_steps", type=int)
    tuning.add_argument("--t-min", type=float)
    tuning.add_argument("--t-max", type=float)
    tuning.add_argument("--entropy-bound", type=float)
    tuning.add_argument("--confidence-threshold", type=float)
    tuning.add_argument("--stability-threshold", type=int)
    args = parser.parse_args(argv)
    if not 1 <= args.n <= corpus.HELDOUT_POOL:
        parser.error(f"--n must be in 1..{corpus.HELDOUT_POOL}, got {args.n}")
    if not (args.model / "config.json").is_file():
        parser.error(f"--model {args.model}: no config.json there (not a model directory)")
    if args.scheduler != "entropy_bound" and args.impl in ("transformers", "all"):
        parser.error(f"--scheduler {args.scheduler} runs on the engine only: add --impl engine or --impl engine-chunked")
    return args


def generation_config_for(model: DiffusionGemmaForBlockDiffusion, args: argparse.Namespace) -> DiffusionGemmaGenerationConfig:
    """The model's generation config with the CLI overrides, resolved the way generate() resolves it."""
    config = model.generation_config
    overrides = {key: getattr(args, key) for key in OVERRIDES if getattr(args, key) is not None}
    if args.entropy_bound is not None:
        overrides["sampler_config"] = EntropyBoundSamplerConfig(entropy_bound=args.entropy_bound)
    # The very function generate() uses, so the stopping-rule recorder sees generate()'s own values.
    config, _ = model._prepare_generation_config(config, **overrides)
    return config


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    model, _ = load_transformers(args.model)
    try:
        config = generation_config_for(model, args)
    except ValueError as error:
        print(f"python -m dgemma.embedded.eval: error: {error}", file=sys.stderr)
        return 2
    impls = list(IMPLS) if args.impl == "all" else [args.impl]
    texts = {}
    for impl in impls:
        rows, texts[impl] = evaluate(args.model, impl, args.families, args.n, config, args.seed, args.show, args.scheduler)
        for row in rows:
            print(json.dumps(row) if args.json else _format_row(row), flush=True)
        summary = {"scheduler": args.scheduler, **summarize(rows)}
        print(json.dumps({"summary": summary}) if args.json else _format_row({**summary, "family": "SUMMARY"}))
    if args.pins:
        from dgemma.embedded.pinned import pinned_rows

        for row in pinned_rows(generate_engine, args.model, args.families, args.n, config, args.seed, model.config.canvas_length):
            print(json.dumps(row) if args.json else _format_row(row), flush=True)
    if "engine" in texts and "engine-chunked" in texts:
        # The chunked sampler projects per vocab chunk: a matmul's blocking may change a bit.
        mismatch = {"mismatch": {"a": "engine", "b": "engine-chunked", **mismatch_per_million(texts["engine"], texts["engine-chunked"])}}
        print(json.dumps(mismatch) if args.json else f"engine vs engine-chunked: {mismatch['mismatch']}")
    return 0


def _format_row(row: dict) -> str:
    figures = ", ".join(f"{key} {value}" for key, value in row.items() if key not in ("impl", "family"))
    return f"{row['impl']:>12} {row['family']:>8}: {figures}"


if __name__ == "__main__":
    sys.exit(main())
