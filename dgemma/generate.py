"""`python -m dgemma.generate`: prompts in, text out, through the app's own run (EngineBackend, EngineRun).

    python -m dgemma.generate --prompt "add 12+34" --prompt "reverse hello" --seed 1 --json

`--seed S` gives the i-th request (0-based, in the order given) the seed S + i, so any run of
the same prompts and seed gives the same tokens, whatever `--max-num-seqs` or `--tiling`.
With `--json`: one object per request, in input order, then `{"summary": {...}}`. `--record FILE`
saves the run as the app's run file (every step of every request), for the app's "Load a run".
Bad input prints one line to stderr and exits non-zero: 2 for the command line (a prompt, a
setting: refused by the one door, dgemma/settings.py's `make_request`, in the page's and the API's
words) or start-up, 1 when a request failed (the other requests still run and print).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict
from typing import TextIO

from dgemma.events import Status
from dgemma.cli import ArgumentParser, positive_int
from dgemma.errors import SettingsError
from dgemma.sampling import SamplingParams
from dgemma.settings import NAMES, SETTINGS, CanvasModel, Limits, Settings, make_request, name_value_pairs

EXIT_REQUEST_FAILED, EXIT_USAGE = 1, 2
DEFAULT_MAX_NEW_TOKENS = 64
# The command line's own limits: one user, no one to starve (the engine's own sizes, at most).
LIMITS = Limits(max_prompts=100_000, max_new_tokens=4096, max_queued=100_000, max_prompt_chars=1_000_000)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    # Settings flags stay text (default None: the model's default); dgemma.settings judges them, as it
    # does the API's and the UI's, so a mistake reads the same sentence everywhere.
    p = ArgumentParser(prog="python -m dgemma.generate", description="Generate text with a DiffusionGemma model.")
    p.add_argument("--prompt", action="append", default=[], help="a prompt (repeatable)")
    p.add_argument("--prompts-file", help="a file with one prompt per line (blank lines are skipped)")
    p.add_argument("--model", default=None, help="checkpoint directory or hub id (default: the embedded model)")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    p.add_argument("--load-format", default="auto", choices=["auto", "dummy"],
                   help="auto: the checkpoint's weights; dummy: random weights of its config, built on the device")
    p.add_argument("--experts", default="auto", choices=["auto", "per_canvas", "whole_batch"],
                   help="many experts per canvas (batch-invariant; CPU default) or whole batch (CUDA default)")
    p.add_argument("--max-num-seqs", type=positive_int, default=8, help="requests denoising at once (default 8)")
    for setting in SETTINGS:  # one flag per setting of the one table, its help the page's and the API's
        flag = "--" + setting.name.replace("_", "-")
        if setting.widget == "checkbox":
            p.add_argument(flag, dest=setting.name, action="store_true", default=None, help=setting.help)
        elif setting.widget == "pins":  # one --pin POSITION=TEXT a pin
            p.add_argument("--pin", dest=setting.name, action="append", default=[], metavar="POSITION=TEXT",
                           help=f"{setting.help} (repeatable)")
        else:
            p.add_argument(flag, dest=setting.name, help=setting.help)
    p.add_argument("--json", action="store_true", help="one JSON object per request, then a summary line")
    p.add_argument("--record", metavar="FILE", help="also save the run, every step of every request, as the app's "
                                                    "run file (JSON lines; the app's 'Load a run' replays it)")
    return p.parse_args(argv)


def read_prompts(args: argparse.Namespace) -> list[str]:
    prompts = list(args.prompt)
    if args.prompts_file:
        try:
            with open(args.prompts_file, encoding="utf-8") as f:
                prompts += [line.rstrip("\n") for line in f if line.strip()]
        except (OSError, UnicodeDecodeError) as err:
            raise ValueError(f"cannot read --prompts-file {args.prompts_file}: {err.strerror or err}") from None
    if not prompts:
        raise ValueError("give at least one --prompt or a --prompts-file")
    return prompts


def pins_from_flags(flags: list[str]) -> dict[str, str] | None:
    """--pin POSITION=TEXT flags as the settings' {position: text} (the text may hold '=')."""
    problem = "--pin takes POSITION=TEXT (for example --pin 3=x), got {part!r}"
    # A box's blank lines are nothing; a blank flag was typed, and is as wrong as any other without '='.
    blank = [flag for flag in flags if not flag.strip()]
    if blank:
        raise SettingsError(problem.format(part=blank[0]))
    return name_value_pairs(flags, problem) or None


def early_check(raw: dict[str, object]) -> dict[str, object]:
    """`raw` for a check before the (slow) model load: the model's defaults are not known yet, so a
    lone --t-min or --t-max is paired with itself (always in order) instead of a default; --start and
    --pin are the model's to judge, once it has loaded."""
    t_min, t_max = raw["t_min"], raw["t_max"]
    if (t_min is None) != (t_max is None):
        raw = {**raw, "t_min": t_min if t_min is not None else t_max, "t_max": t_max if t_max is not None else t_min}
    return {**raw, "start": None, "pins": None}


def not_loaded() -> CanvasModel:
    raise ValueError("the model has not loaded yet")  # never asked: the early check leaves out --start and --pin


def run(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        prompts = read_prompts(args)
        # The settings flags by their setting names; None where a flag was not given.
        raw = {**{name: getattr(args, name) for name in NAMES}, "pins": pins_from_flags(args.pins)}
        # A check before the (slow) model load, on the defaults known now; the call is made again on the
        # model's own defaults once it has loaded, through the same door.
        early = make_request(prompts, early_check(raw), Settings(max_new_tokens=DEFAULT_MAX_NEW_TOKENS), LIMITS,
                             args.max_num_seqs, not_loaded).settings
        record = open_record(args.record)
    except ValueError as err:
        return _fail(str(err), EXIT_USAGE)

    from transformers.utils import logging as hf_logging

    from dgemma.engine import EngineConfig, EngineError
    from dgemma.metrics import run_summary, summary_line
    from dgemma.model.loading import ModelLoadError, load_model
    from dgemma.recording import Recording, run_header
    from dgemma.serving.backend import read_run
    from dgemma.serving.engine_backend import EngineBackend

    hf_logging.disable_progress_bar()  # stderr carries only our own lines
    options, backend = early.options, None
    try:
        loaded = load_model(args.model, device=args.device, memory_budget=options.memory_budget,
                            load_format=args.load_format, experts=args.experts)
        # The budget is the run's own, as the API's is: the ledger refuses a run it cannot hold in the same words.
        config = EngineConfig(max_num_seqs=args.max_num_seqs, tiling=options.tiling, sampler=options.sampler)
        backend = EngineBackend(loaded, config, LIMITS, None)
        model_defaults = SamplingParams.from_generation_config(loaded.model.generation_config)
        # --start and --pin against the model (one token a pin, inside the canvas) before anything runs.
        call = make_request(prompts, raw, Settings(model_defaults, options, DEFAULT_MAX_NEW_TOKENS), LIMITS,
                            args.max_num_seqs, backend.canvas_model)
    except (ModelLoadError, EngineError, ValueError) as err:
        if backend is not None:
            backend.close()
        return _fail(str(err), EXIT_USAGE)

    settings = call.settings
    notes = prompt_notes(prompts, bool(loaded.facts()["embedded"]))
    if loaded.random_weights:
        print(f"python -m dgemma.generate: note: {loaded.facts()['note']}", file=sys.stderr)
    recording = Recording(run_header({**loaded.facts(), "max_num_seqs": args.max_num_seqs}, settings, prompts))
    started = time.monotonic()
    try:  # the app's own run: every tile plan, and with --record every step frame, read as the run goes
        run = backend.start(call, stream=record is not None)
        progress = read_run(run, recording)
        run.close()
        stats = dict(backend.engine.stats)  # steps, decoder calls and splits, preemptions
    except ValueError as err:  # a run its options cannot hold: EngineBackend.start's one sentence
        return _fail(str(err), EXIT_USAGE)
    finally:
        backend.close()
    finals, tile_plans, options = list(progress.last.values()), progress.plans, settings.options
    wall = time.monotonic() - started
    figures = run_summary([f.extra.get("metrics") for f in finals], wall)
    if record is not None:
        recording.summary = figures
        with record:
            record.writelines(recording.lines())

    failed = 0
    for i, final in enumerate(finals):
        if final.status != Status.DONE:
            failed += 1
            print(f"python -m dgemma.generate: error: request {final.request_id} ({final.prompt[:40]!r}): "
                  f"{final.error or final.status}", file=sys.stderr)
        if args.json:
            print(json.dumps(dict(prompt=final.prompt, text=final.text, token_ids=list(final.token_ids),
                                  steps=final.steps, canvases=final.canvases, seed=final.seed,
                                  status=final.status, error=final.error, warning=notes[i],
                                  metrics=final.extra.get("metrics"))))
        elif final.status == Status.DONE:
            print(f"{final.prompt}\t->\t{final.text}")
    canvas_tokens = sum(f.canvases for f in finals) * loaded.canvas_length
    summary = dict(
        requests=len(finals), failed=failed, wall_seconds=round(wall, 4),
        canvas_tokens_per_s=round(canvas_tokens / wall, 2) if wall > 0 else None,
        weights=loaded.facts()["weights"], experts=loaded.experts,
        max_num_seqs=args.max_num_seqs, tiling=str(options.tiling), sampler=options.sampler, memory_budget=args.memory_budget,
        engine=stats,  # steps, decoder calls and splits, preemptions
        metrics=figures,  # tokens/s, tokens per forward, steps per canvas, decoder/sampler shares, peak sampler memory
        tile_plans=[asdict(p) for p in tile_plans],
    )
    if args.json:
        print(json.dumps({"summary": summary}))
    else:
        print(f"{len(finals)} requests, {failed} failed, {wall:.2f} s, {summary['weights']} weights, "
              f"{summary['canvas_tokens_per_s']} canvas tokens/s, {len(tile_plans)} sampler calls", file=sys.stderr)
        print(summary_line(figures), file=sys.stderr)
    return EXIT_REQUEST_FAILED if failed else 0


def prompt_notes(prompts: list[str], embedded: bool) -> list[str]:
    """Each prompt's note (the teaching model's scope; "" for a real checkpoint), printed once per
    prompt on stderr before the run, so the answers that follow are read for what they are."""
    from dgemma.examples import prompt_note

    notes = [prompt_note(embedded, p) for p in prompts]
    for i, (prompt, note) in enumerate(zip(prompts, notes, strict=True)):
        if note:
            print(f"python -m dgemma.generate: note: prompt {i + 1} ({prompt[:40]!r}): {note}", file=sys.stderr)
    return notes


def open_record(path: str | None) -> TextIO | None:
    """The --record file, opened now so a bad path fails before the (slow) model load."""
    if path is None:
        return None
    try:
        return open(path, "w", encoding="utf-8", newline="\n")
    except OSError as err:
        raise ValueError(f"cannot write --record {path}: {err.strerror or err}") from None


def _fail(message: str, code: int) -> int:
    print(f"python -m dgemma.generate: error: {message}", file=sys.stderr)
    return code


def main(argv: list[str] | None = None) -> int:
    try:
        return run(argv)
    except SystemExit as exit_:  # argparse: the one line is printed already; return its code
        return int(exit_.code or 0)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
