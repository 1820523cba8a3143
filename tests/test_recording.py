"""Every run is recorded: the recording is the run's live events, its file replays the same frames,
a bad file is refused with one sentence, and the record stays inside its stated bound."""

from __future__ import annotations

import json
import inspect
import tracemalloc

import pytest

from dgemma.events import RequestEvent, StepEvent, TilePlan
from dgemma.recording import MAX_FILE_BYTES, MAX_POSITIONS, Recording, RecordingError, load, load_file, run_header
from dgemma.sampling import SamplingParams
from dgemma.settings import RunRequest, Settings
from dgemma.ui.generate_tab import playback
from dgemma.ui.seek import Seeker
from dgemma.ui.board import Board, fold
from dgemma.ui.compact import CELLS, frame
from dgemma.settings import Limits
from dgemma.serving.backend import Progress
from dgemma.serving.runs import ticks

PROMPTS = ["add 12+34", "reverse hello", "count 5 to 12", "story: big cat, park", "A", "B"]


@pytest.fixture(scope="module")
def recorded(tiny_model):
    """A seeded run of 6 prompts on 4 slots (two wait), 2 canvases each, read as the page reads it,
    next to a spy: a subscription that keeps every event the engine emitted, in order."""
    from dgemma.engine import EngineConfig
    from dgemma.serving.engine_backend import EngineBackend

    backend = EngineBackend(tiny_model, EngineConfig(max_num_seqs=4, tiling=2), Limits(), None)
    try:
        spy = backend.engine.subscribe(coalesce=False)
        settings = Settings(SamplingParams(max_denoising_steps=3, seed=7), max_new_tokens=2 * tiny_model.canvas_length)
        run = backend.start(RunRequest(tuple(PROMPTS), settings))
        recording = Recording(run_header(backend.info(), settings, PROMPTS))
        progress = Progress(run.size, recording)
        board = Board()
        for tick in ticks(lambda timeout: progress.add(run.poll(timeout)), lambda: progress.over):
            fold(tick.events, board)
        live = []
        while batch := spy.poll(0.2):
            live += batch
    finally:
        backend.close()
    return recording, board, live


def test_the_recording_of_a_seeded_run_equals_its_live_events(recorded):
    recording, board, live = recorded
    assert list(recording.events()) == live  # every event, in order: no frame merged or dropped
    assert frame(fold(recording.events())) == frame(board)  # the live page's last frame
    header = recording.header
    assert header["format"] == "dgemma-run" and header["prompts"] == PROMPTS and header["seeds"] == [7, 8, 9, 10, 11, 12]
    assert header["settings"]["params"]["max_denoising_steps"] == 3 and "torch" in header["versions"]


def test_steps_are_sampler_calls_and_step_zero_is_every_started_canvas_at_random(recorded):
    recording, _, live = recorded
    assert recording.steps == sum(isinstance(e, TilePlan) for e in live) > 3
    start = fold(recording.events(0))
    running = [v for v in start.requests.values() if v.status != "queued"]
    assert len(running) == 4 and len(start.requests) == len(PROMPTS)  # 4 slots: the other two wait
    for view in running:
        assert view.last_step.step == 0 and not any(view.last_step.accepted)  # all noise, nothing kept
    rows = frame(start)["rows"]
    assert [r["label"] for r in rows].count("random start (step 0 of 3)") == 4
    assert not any(c in CELLS["accepted"] for r in rows for c in r["cells"])
    end = fold(recording.events(recording.steps))
    finals = {e.request_id: e.text for e in live if isinstance(e, RequestEvent) and e.status == "done"}
    assert {r: v.committed_text for r, v in end.requests.items()} == finals


def test_a_download_and_upload_round_trip_gives_identical_frames(recorded):
    recording = recorded[0]
    copy = load(recording.text().encode("utf-8"))
    assert copy.header == recording.header and copy.steps == recording.steps
    assert list(copy.events()) == list(recording.events())
    for step in range(recording.steps + 1):
        assert same_view(playback.view(recording, step), playback.view(copy, step)), step


def same_view(a: dict, b: dict) -> bool:
    return (a["cards"], a["entropy"].plot, a["tiles"].plot) == (b["cards"], b["entropy"].plot, b["tiles"].plot)


def test_a_kept_board_gives_the_views_of_a_fresh_fold_in_any_order_of_steps(recorded):
    recording = recorded[0]
    copy = load(recording.text().encode("utf-8"))
    last = recording.steps
    kept = Seeker()
    # play through, a step back, a jump to the end, the same step twice, the start, then another recording
    for rec, step in [(recording, s) for s in [*range(last + 1), last - 1, 1, last, last, 0, 2]] + [(copy, 3), (recording, 3)]:
        assert same_view(playback.view(rec, step, kept), playback.view(rec, step)), (rec is copy, step)


def test_a_kept_board_following_a_live_recording_folds_what_arrived_since(recorded):
    recording, _, live = recorded
    growing, kept = Recording(recording.header), Seeker()
    for i, event in enumerate(live):
        growing.add(event)
        if i % 7 == 0 or i == len(live) - 1:  # the page's view of the latest step, every few events
            assert same_view(playback.view(growing, growing.steps, kept), playback.view(growing, growing.steps)), i


def test_the_views_at_a_step_mark_it_on_both_charts(recorded):
    recording = recorded[0]
    shown = playback.view(recording, 2)
    entropy, tiles = json.loads(shown["entropy"].plot), json.loads(shown["tiles"].plot)
    assert tiles["layout"]["shapes"][-1]["x0"] == 2 and tiles["layout"]["annotations"][-1]["text"] == "call 2"
    assert tiles["layout"]["xaxis"]["range"] == [1, recording.steps]  # the axis spans the whole run
    assert entropy["layout"]["annotations"][-1]["text"] == "step 2"
    assert entropy["data"][-1]["name"] == "at this step"  # each request's point at this step


def test_a_truncated_file_is_refused_with_one_sentence(recorded):
    text = recorded[0].text()
    for cut in (text[: len(text) // 2], text[: text.rindex("\n", 0, -1) + 1]):  # mid-line; at a line's end
        with pytest.raises(RecordingError, match=r"^This run file is cut short[^\n]*\.$"):
            load(cut)


def test_an_edited_file_is_refused_with_one_sentence(recorded):
    text = recorded[0].text()
    edited = text.replace('"text": "', '"text": "x', 1)
    with pytest.raises(RecordingError, match=r"^This run file was changed after it was recorded[^\n]*\.$"):
        load(edited)


@pytest.mark.parametrize("data, sentence", [
    (b"", "not a dgemma run: its first line"),
    (b"\x89PNG\r\n\x1a\n\x00\x00", "not a dgemma run: it is not text"),
    (b'{"format": "something-else"}\n{}\n', "not a dgemma run: its first line"),
    (b'{"format": "dgemma-run", "version": 99}\n{}\n', "format version 99; this app reads version 1"),
])  # fmt: skip
def test_a_foreign_file_is_refused_with_one_sentence(data, sentence):
    with pytest.raises(RecordingError, match=sentence) as err:
        load(data)
    assert "\n" not in str(err.value) and str(err.value).endswith(".")


def step_frame(request_id: int, step: int, canvas_length: int = 256) -> StepEvent:
    """A step frame of the released model's canvas, as the engine builds it (pieces from a table)."""
    ids = tuple((request_id * 7919 + step * 31 + i) % 262_144 for i in range(canvas_length))
    entropy = tuple(((i * 0.37) % 1.0) / (step + 1) for i in range(canvas_length))
    return StepEvent(request_id, 0, step, 512, ids, tuple(f"p{t}" for t in ids), entropy,
                     tuple(i % 3 == 0 for i in range(canvas_length)), sum(entropy) / canvas_length, 0.005, False)


def test_the_record_bound_holds_at_32_requests_times_the_step_limit():
    """The released model's canvas (256) x 32 requests x 512 steps: every frame is kept, in about
    13 bytes a position; one frame more is counted as dropped, never kept."""
    templates = [step_frame(r, s) for r in range(1, 33) for s in (1, 2)]  # distinct content, reused to save time
    recording = Recording()
    tracemalloc.start()
    for step in range(1, 513):
        recording.add(TilePlan(0.0, "reference", 32, 256, 262_144, 2**34, None, 2**20, 32, (32,), 2**25))
        for r in range(32):
            recording.add(templates[2 * r + step % 2])
    held, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert recording.positions == 32 * 512 * 256 == MAX_POSITIONS and recording.dropped_frames == 0
    assert held < 16 * MAX_POSITIONS, held  # ~13 bytes a position (ids, entropies, mask) plus small per-frame costs
    recording.add(step_frame(1, 513))
    assert recording.dropped_frames == 1 and recording.positions == MAX_POSITIONS
    recording.add(RequestEvent(1, "done", text="kept"))  # final texts are still recorded past the bound
    assert fold(recording.events()).requests[1].committed_text == "kept"


def run_of(requests: int, steps: int, canvas_length: int) -> Recording:
    """A recording of `requests` x `steps` step frames at `canvas_length`, each request committed at the end."""
    recording = Recording()
    for step in range(1, steps + 1):
        recording.add(TilePlan(0.0, "reference", requests, canvas_length, 262_144, 2**34, None, 2**20, requests,
                               (requests,), 2**25))
        for r in range(1, requests + 1):
            recording.add(step_frame(r, step, canvas_length))
    for r in range(1, requests + 1):
        ids = tuple(range(canvas_length))
        recording.add(RequestEvent(r, "committed", token_ids=ids, text="x" * canvas_length,
                                   extra={"logprobs": [-0.5] * canvas_length}))
        recording.add(RequestEvent(r, "done", text="x" * canvas_length))
    return recording


@pytest.mark.parametrize("requests, steps, canvas_length", [(8, 40, 16), (32, 24, 256)])
def test_what_a_recording_says_it_holds_is_within_a_fifth_of_what_it_holds(requests, steps, canvas_length):
    """held_bytes (what the memory cap counts) against tracemalloc, for a recording loaded from its
    file: every object it keeps was allocated by the load, the decoded events were freed. Only the
    blocks allocated under this test's call of `load` count: a thread an earlier test left running
    allocates meanwhile, in recording.py too (a run's reader records its events)."""
    data = run_of(requests, steps, canvas_length).text().encode("utf-8")
    tracemalloc.start(16)  # deep enough that every block the load allocates has the call below among its frames
    call = inspect.currentframe().f_lineno + 1
    loaded = load(data)
    snapshot = tracemalloc.take_snapshot()
    tracemalloc.stop()
    under_load = snapshot.filter_traces([tracemalloc.Filter(True, __file__, call, all_frames=True)])
    held = sum(trace.size for trace in under_load.traces)
    assert 0.8 * held <= loaded.held_bytes <= 1.2 * held, (loaded.held_bytes, held)


def test_a_file_over_the_cap_is_refused_by_its_size_without_being_read(tmp_path):
    big = tmp_path / "big.jsonl"
    with open(big, "wb") as f:
        f.truncate(MAX_FILE_BYTES + 1)  # sparse: no disk used, and reading it would take 256 MB
    tracemalloc.start()
    with pytest.raises(RecordingError, match=r"^This file is 256 MB, more than any run file can be \(256 MB\)"):
        load_file(str(big))
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 2**20, peak


def test_a_run_file_loads_from_its_path_as_from_its_bytes(recorded, tmp_path):
    path = tmp_path / "run.jsonl"
    recorded[0].save(str(path))
    assert list(load_file(str(path)).events()) == list(recorded[0].events())


def test_a_load_decodes_the_file_where_it_lies_holding_no_second_copy_of_it():
    """At most the recording it makes and a line at a time beside the file's bytes (a text copy, a
    list of lines and their joined copy for the checksum took 4.4 times the file before)."""
    data = run_of(32, 20, 256).text().encode("utf-8")
    tracemalloc.start()
    loaded = load(data)
    held, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    # What load allocates at its peak, the recording it makes and a line at a time, is about twice
    # the file's size (2.002x on CPython 3.10, whose json allocates a little more); the copies took 4.4x.
    assert held <= 1.2 * loaded.held_bytes and peak <= 2.5 * len(data), (held, peak, len(data))
