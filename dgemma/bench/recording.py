"""`python -m dgemma.bench recording`: what a run's recording costs at its bound, against keeping events.

The bound (dgemma/recording.py): the released model's canvas (256) x 32 requests x the step limit
(512 denoising steps) = 4,194,304 canvas positions. This fills a recording with that many step
frames (one TilePlan per step, as a run has; frame contents vary like real ones: ids over the
released vocabulary, entropies of every magnitude) and reports, side by side, the bytes the
recording holds and the bytes the same frames hold as event objects (what a recorder that kept
the engine's events would hold), the file's size, and the time to write it, load it, and fold the
board at the last step (what a jump of the page's slider does) against folding only that step's
events onto the board kept from the step before (what play and forward do); and, per step of 32
requests, what recording adds to the live stream's own work (its fold and its render). `--steps N`
scales the run down.
"""

from __future__ import annotations

import functools
import gc
import tracemalloc
from collections.abc import Iterator

from dgemma.bench import print_row, timed
from dgemma.cli import ArgumentParser, positive_int
from dgemma.events import StepEvent, TilePlan
from dgemma.recording import MAX_POSITIONS, Recording, load

CANVAS, REQUESTS, VOCAB = 256, 32, 262_144


@functools.cache  # one string per token id, as the engine's detokenizer caches them
def _piece(token: int) -> str:
    return f"▁w{token}"


def frame(request_id: int, step: int) -> StepEvent:
    ids = tuple((request_id * 7919 + step * 104_729 + i * 31) % VOCAB for i in range(CANVAS))
    entropy = tuple(((i * 0.37 + step) % 1.0) ** 3 * 12.0 for i in range(CANVAS))
    return StepEvent(request_id, 0, step, 512, ids, tuple(_piece(t) for t in ids), entropy,
                     tuple((i + step) % 3 == 0 for i in range(CANVAS)), sum(entropy) / CANVAS, 0.005, False)


def plan(step: int) -> TilePlan:
    return TilePlan(float(step), "reference", REQUESTS, CANVAS, VOCAB, 2**36, None, 700 * 2**20, 16, (16, 16), 2**34)


def run_events(steps: int) -> Iterator[TilePlan | StepEvent]:
    """A run of REQUESTS x CANVAS and `steps` steps, as the recorder sees it: each step's plan, then its frames."""
    for step in range(1, steps + 1):
        yield plan(step)
        for r in range(1, REQUESTS + 1):
            yield frame(r, step)


def recorded_run(steps: int) -> Recording:
    """The run of `run_events(steps)`, recorded."""
    recording = Recording()
    recording.extend(run_events(steps))
    return recording


def held(build) -> tuple[object, int]:
    """What `build()` returns and the bytes it holds (tracemalloc, after a collection)."""
    gc.collect()
    tracemalloc.start()
    value = build()
    gc.collect()
    size, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return value, size


def live_cost(steps: int = 20) -> dict:
    """What recording adds to a live stream, per step of 32 requests at canvas 256: the reader's
    fold of the step's 33 events, the recording's add of the same events, and one compact frame
    of the cards (the page sends at most 6 frames a second, folds every event)."""
    from dgemma.ui.board import Board, fold
    from dgemma.ui.compact import frame as compact_frame

    events = [[plan(s), *(frame(r, s) for r in range(1, REQUESTS + 1))] for s in range(1, steps + 1)]
    board, recording = Board(), Recording()
    fold_s = record_s = render_s = 0.0
    for batch in events:
        fold_s += timed(fold, batch, board)[1]
        record_s += timed(recording.extend, batch)[1]
        render_s += timed(compact_frame, board)[1]
    return {"live_fold_ms_per_step": round(1e3 * fold_s / steps, 3),
            "live_record_ms_per_step": round(1e3 * record_s / steps, 3),
            "live_render_ms_per_frame": round(1e3 * render_s / steps, 3),
            "record_vs_fold_and_render": round(record_s / (fold_s + render_s), 3)}


def main(argv: list[str] | None = None) -> int:
    p = ArgumentParser(prog="python -m dgemma.bench recording", description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=positive_int, default=512, help="denoising steps per request (default 512: the bound)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    list(run_events(args.steps))  # fill the piece cache first: it is the engine's, not the recorder's
    recording, recording_bytes = held(lambda: recorded_run(args.steps))
    events, event_bytes = held(lambda: list(run_events(args.steps)))
    positions = recording.positions
    del events
    text, write_s = timed(recording.text)
    copy, load_s = timed(load, text)
    from dgemma.ui.board import fold
    from dgemma.ui.seek import Seeker

    _, fold_s = timed(lambda: fold(copy.events(copy.steps)))
    kept = Seeker()  # what playing does: the board of the step before is kept, one step's events folded

    def seek(step: int) -> None:
        with kept.at(copy, step):
            pass

    _, index_s = timed(seek, copy.steps - 1)  # from nothing: every keyframe is made and counted on the way
    _, next_step_s = timed(seek, copy.steps)
    live = live_cost()
    result = {
        "positions": positions, "bound": MAX_POSITIONS, "dropped_frames": recording.dropped_frames,
        "recording_MB": round(recording_bytes / 1e6, 1), "recording_counted_MB": round(recording.held_bytes / 1e6, 1),
        "as_events_MB": round(event_bytes / 1e6, 1),
        "recording_bytes_per_position": round(recording_bytes / positions, 1),
        "events_bytes_per_position": round(event_bytes / positions, 1),
        "file_MB": round(len(text.encode("utf-8")) / 1e6, 1), "write_s": round(write_s, 2), "load_s": round(load_s, 2),
        "fold_last_step_s": round(fold_s, 2), "seek_last_step_from_nothing_s": round(index_s, 2),
        "seeker_counted_MB": round(kept.held_bytes() / 1e6, 1), "fold_next_step_kept_ms": round(next_step_s * 1e3, 2), **live,
    }  # fmt: skip
    print_row(result, args.json)
    return 0
