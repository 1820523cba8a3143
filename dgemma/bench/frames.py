"""`python -m dgemma.bench frames RUN.jsonl ...`: what one frame of the live view costs, the full board vs compact data.

For every step of each recorded run (`python -m dgemma.generate --record FILE`), the board is sent
both ways, the full board as JSON (`full_board`, the baseline) and the compact frame (what the
browser draws). Printed side by side: bytes per frame as JSON, gzip'd alone and gzip'd as one stream
flushed after every frame (what the event stream sends), the server's milliseconds to build a frame,
and bytes per second at the page's 6 frames a second. Then seeking: a random step refolded from
step 0 against from the nearest keyframe, and the slider's whole view (cards and charts), of each run
and of a synthetic 32 x 256 x 48-step run (`--slider-steps`). With `--lesson MODEL`, the same for
the frames of one of the lesson tab's real-scale runs on MODEL (tiled or chunked: docs/benchmarks.md).
"""

from __future__ import annotations

import json
import random
import statistics
import time
import zlib

from dgemma.bench import print_row, timed
from dgemma.bench.recording import recorded_run
from dgemma.cli import ArgumentParser
from dgemma.recording import Recording, load_file
from dgemma.ui.board import Board, fold
from dgemma.ui.compact import frame

FRAMES_PER_S = 6.0  # the live stream's rate (dgemma/serving/runs.py HZ)


def wire(value) -> bytes:
    """A frame as Gradio sends it: JSON, UTF-8 (orjson keeps non-ASCII as is)."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def full_board(board: Board) -> dict:
    """The board as it is folded, as JSON-ready data: what a view without the compact encoding sends."""
    def step(view):
        s = view.last_step
        return None if s is None else {"step": s.step, "pieces": list(s.pieces), "entropy": list(s.entropy),
                                       "accepted": list(s.accepted), "token_ids": list(s.token_ids)}
    return {"threshold": board.confidence_threshold, "calls": board.plan_count, "requests": [
        {"index": v.index, "request": v.request_id, "seed": v.seed, "status": v.status, "prompt": v.prompt,
         "text": v.committed_text, "canvases": v.canvases, "step": step(v)} for v in board.requests.values()]}


def sizes(payloads: list[bytes]) -> dict:
    """Median bytes per frame: raw, gzip'd alone, gzip'd as one stream flushed per frame."""
    stream = zlib.compressobj(6, zlib.DEFLATED, 31)
    streamed = [len(stream.compress(p) + stream.flush(zlib.Z_SYNC_FLUSH)) for p in payloads]
    return {"raw": max(len(p) for p in payloads), "raw_median": statistics.median(len(p) for p in payloads),
            "gzip": statistics.median(len(zlib.compress(p, 6)) for p in payloads),
            "gzip_stream": statistics.median(streamed), "gzip_stream_max": max(streamed)}


def measure_run(recording: Recording, refine: bool = True) -> dict:
    length = int(recording.header.get("model", {}).get("canvas_length") or 0)
    full, compact = [], []  # (frame as sent, seconds to build it) of every step
    board = None
    for step in range(recording.steps + 1):
        board = fold(recording.events_between(recording.end_of_step(step - 1) if step else 0,
                                               recording.end_of_step(step)), board)
        full.append(timed(lambda: wire(full_board(board))))
        compact.append(timed(lambda: wire(frame(board, length, refine))))
    f, c = sizes([payload for payload, _ in full]), sizes([payload for payload, _ in compact])
    return {
        "requests": len(recording.header.get("prompts", [])), "canvas": length, "steps": recording.steps,
        "full_bytes_max": f["raw"], "compact_bytes_max": c["raw"], "compact_over_full": round(c["raw"] / f["raw"], 3),
        "full_gzip_bytes": f["gzip"], "compact_gzip_bytes": c["gzip"],
        "full_gzip_stream_bytes": f["gzip_stream"], "compact_gzip_stream_bytes": c["gzip_stream"],
        "compact_gzip_stream_bytes_max": c["gzip_stream_max"],
        "full_bytes_per_s": round(f["raw_median"] * FRAMES_PER_S), "compact_gzip_bytes_per_s": round(c["gzip_stream"] * FRAMES_PER_S),
        "full_build_ms": round(1e3 * statistics.median(s for _, s in full), 2),
        "compact_build_ms": round(1e3 * statistics.median(s for _, s in compact), 2),
    }  # fmt: skip


def measure_seek(recording: Recording, jumps: int = 20, seed: int = 0) -> dict:
    """Server seconds to show a random step: refolded from 0 against from the nearest keyframe."""
    from dgemma.ui.seek import Seeker

    rng = random.Random(seed)  # one generator: a fresh one per jump drew the same step every time
    steps = [rng.randint(0, recording.steps) for _ in range(jumps)]
    started = time.perf_counter()
    for step in steps:
        fold(recording.events(step))
    from_zero = (time.perf_counter() - started) / jumps
    seeker = Seeker()
    _, index_s = timed(seeker.index, recording)
    times = []
    for step in steps:
        started = time.perf_counter()
        with seeker.at(recording, step) as board:
            frame(board)
        times.append(time.perf_counter() - started)
    return {"seek_from_step0_fold_ms": round(1e3 * from_zero, 1), "seek_keyframe_fold_and_frame_ms_max": round(1e3 * max(times), 1),
            "seek_keyframe_fold_and_frame_ms_median": round(1e3 * statistics.median(times), 1),
            "seek_index_ms": round(1e3 * index_s, 1), "keyframes": seeker.keyframes}  # fmt: skip


def measure_slider(recording: Recording, jumps: int = 12, seed: int = 0) -> dict:
    """Server seconds for the slider to show a random step of `recording`: the whole view (cards and
    both charts), folded from step 0 and sent as the full board (the baseline) against what the slider's
    handler does now (`playback.view`: from the nearest keyframe, a compact frame), after the
    run's load has indexed its keyframes (as "Load a run" does). Wall time, and the thread's CPU
    time, which other jobs on a loaded machine do not inflate."""
    from dgemma.ui.charts import board_tile_figure, entropy_figure, mark_step, plot
    from dgemma.ui.generate_tab.playback import view
    from dgemma.ui.seek import Seeker

    steps = recording.steps
    rng = random.Random(seed)  # one generator: a fresh one per jump drew the same step every time
    targets = [rng.randint(0, steps) for _ in range(jumps)]
    before, after, after_cpu = [], [], []
    for step in targets:
        started = time.perf_counter()
        board = fold(recording.events(step))
        mark_step(entropy_figure(board), step, (0, steps), f"step {step}", now=True)
        wire(full_board(board)), plot(entropy_figure(board)), plot(board_tile_figure(board))
        before.append(time.perf_counter() - started)
    seeker = Seeker()
    _, index_s = timed(seeker.index, recording)
    for step in targets:
        started, cpu = time.perf_counter(), time.thread_time()
        view(recording, step, seeker)
        after.append(time.perf_counter() - started)
        after_cpu.append(time.thread_time() - cpu)
    return {"slider_steps": steps, "slider_before_ms_max": round(1e3 * max(before), 1),
            "slider_after_ms_max": round(1e3 * max(after), 1),
            "slider_after_ms_median": round(1e3 * statistics.median(after), 1),
            "slider_after_cpu_ms_max": round(1e3 * max(after_cpu), 1),
            "slider_index_on_load_ms": round(1e3 * index_s, 1)}


def lesson_recording(model: str, requests: int, steps: int, dtype: str | None, run: str = "tiled") -> Recording:
    """The lesson's `run` ("tiled" or "chunked") at real scale on `model` (CPU, the suggested budget),
    started as the lesson tab starts it (`Backend.start` with the lesson's run options), every event
    recorded: step k is the board after its k-th sampler call."""
    from dgemma.engine import EngineConfig
    from dgemma.model.loading import load_model, parse_dtype
    from dgemma.serving.backend import read_run
    from dgemma.serving.engine_backend import EngineBackend
    from dgemma.settings import Limits
    from dgemma.ui.lesson import tab

    import torch

    loaded = load_model(model, device="cpu", dtype=parse_dtype(dtype, torch.device("cpu")))
    backend = EngineBackend(loaded, EngineConfig(max_num_seqs=requests), Limits(), None)
    try:
        tiling, impl = ("auto", "reference") if run == "tiled" else ("off", "chunked")
        budget = backend.suggest_budget(requests, True)
        handle = backend.start(tab.lesson_call(backend, requests, steps, None, budget, tiling, impl, real=True))
        recording = Recording({"model": {"canvas_length": loaded.canvas_length}, "prompts": [""] * requests})
        outputs = read_run(handle, recording).outputs()
        handle.close()
    finally:
        backend.close()
    failed = [o.error for o in outputs if o.error]
    if failed:
        raise ValueError(f"the lesson's {run} run did not complete: {failed[0]}")
    return recording


def main(argv: list[str] | None = None) -> int:
    p = ArgumentParser(prog="python -m dgemma.bench frames", description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="*", help="run files (python -m dgemma.generate --record FILE)")
    p.add_argument("--slider-steps", type=int, default=48,
                   help="steps of the synthetic 32 x 256 run the slider moves over (0: none; each run file's own are measured too)")
    p.add_argument("--lesson", metavar="MODEL", help="also measure the lesson's frames: its tiled run on MODEL")
    p.add_argument("--lesson-requests", type=int, default=32)
    p.add_argument("--lesson-steps", type=int, default=2, help="denoising steps of the lesson's run")
    p.add_argument("--lesson-run", choices=("tiled", "chunked"), default="tiled")
    p.add_argument("--dtype", default=None, help="the lesson model's dtype (auto: fp32 on a CPU)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    if args.lesson:
        recording = lesson_recording(args.lesson, args.lesson_requests, args.lesson_steps, args.dtype, args.lesson_run)
        result = {"lesson": args.lesson, "lesson_run": args.lesson_run, **measure_run(recording, refine=False)}
        print_row(result, args.json, end="\n")
    for path in args.runs:
        recording = load_file(path)
        result = {"run": path, **measure_run(recording), **measure_seek(recording), **measure_slider(recording)}
        print_row(result, args.json, end="\n")
    if args.slider_steps > 0:
        result = {"run": "synthetic 32 x 256", **measure_slider(recorded_run(args.slider_steps))}
        print_row(result, args.json)
    return 0
