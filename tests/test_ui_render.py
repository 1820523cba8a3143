"""Pure pieces of the UI: settings checks, the event fold, frame pacing, compact rows, figures.

Events come from the real engine on the embedded model (see `engine_events`), not hand-built.
"""

from __future__ import annotations

import pytest

from dgemma.errors import SettingsError
from dgemma.sampling import SamplingParams
from dgemma.settings import Settings
from dgemma.settings import CanvasModel, Limits, make_request
from dgemma.ui.generate_tab.controls import prompts_from_text
from dgemma.serving.runs import ticks
from fake_clock import Clock

LIMITS = Limits(max_prompts=8, max_new_tokens=64, max_queued=16, max_prompt_chars=100)


# ---------------------------------------------------------------- settings: one clear sentence each


def no_first_canvas() -> CanvasModel:
    raise AssertionError("these calls start from noise: the door asks for no model")


def call_settings(raw, defaults):
    """A one-prompt call's settings as the page's door makes them (a tile of at most 8)."""
    return make_request(["ok"], raw, defaults, LIMITS, 8, no_first_canvas).settings


@pytest.mark.parametrize(
    "raw, words",
    [
        ({"seed": "abc"}, "must be a number"),
        ({"seed": -1}, "between 0"),
        ({"t_min": float("nan")}, "finite"),
        ({"t_max": float("inf")}, "finite"),
        ({"max_denoising_steps": 2.5}, "whole number"),
        ({"max_new_tokens": 10_000}, "between 1 and 64"),
        ({"max_new_tokens": 0}, "between 1 and 64"),
        ({"t_min": 0.9, "t_max": 0.5}, "must not be below"),
        ({"greedy": "maybe"}, "true or false"),
        ({"tiling": "sometimes"}, "auto, off, or a tile size"),
        ({"tiling": 0}, "auto, off, or a tile size"),
        ({"model": "/etc/passwd"}, "Unknown setting"),
        ({"seed": [1]}, "must be a number"),
        ("seed=1", "must be an object"),
    ],
)
def test_bad_settings_are_one_sentence(raw, words):
    with pytest.raises(SettingsError) as err:
        call_settings(raw, Settings())
    message = str(err.value)
    assert words in message
    assert "\n" not in message and message.endswith(".")


def test_settings_use_cli_names_and_defaults():
    s = call_settings({"max-new-tokens": "16", "seed": 7, "greedy": "true", "tiling": "4", "t_min": None}, Settings())
    assert (s.max_new_tokens, s.params.seed, s.params.greedy, s.options.tiling, s.params.t_min) == \
        (16, 7, True, 4, Settings().params.t_min)
    assert call_settings(None, Settings(SamplingParams(seed=3))).params.seed == 3


@pytest.mark.parametrize(
    "prompts, words",
    [
        ([], "at least one prompt"),
        (["ok"] * 9, "Too many prompts: 9 given, at most 8"),
        (["ok", "   "], "Prompt 2 is empty"),
        ([""], "Prompt 1 is empty"),
        (["  \n\t "], "Prompt 1 is empty"),
        (["x" * 101], "characters long"),
        (["\ud800"], "not valid Unicode"),
        ([3], "must be a string"),
        ({"a": 1}, "list of strings"),
    ],
)
def test_bad_prompts_are_one_sentence_at_the_door(prompts, words):
    with pytest.raises(SettingsError, match=words):
        make_request(prompts, None, Settings(), LIMITS, 8, no_first_canvas)


def test_prompts_fill_the_batch_by_cycling():
    assert prompts_from_text("a\n\n b\n", 5) == ["a", " b", "a", " b", "a"]
    assert prompts_from_text("a\nb\nc", 2) == ["a", "b", "c"]
    assert prompts_from_text("  \n", 4) == []


# ---------------------------------------------------------------- frame pacing


def boards_of(poll, hz: float, clock, keepalive: float = 0.5) -> list:
    """The boards a stream of `poll`'s events hands a view: one fold, drawn at each tick that may be."""
    from dgemma.ui.board import Board, fold

    board, drawn = Board(), []
    for tick in ticks(poll, lambda: board.finished, hz=hz, keepalive=keepalive, clock=clock):
        fold(tick.events, board)
        if tick.send:
            drawn.append((board.events, board.finished))
    return drawn


def test_ticks_fold_many_events_into_few_renders():
    """1000 events spread over 2 s of (fake) time give about 2 s x 6 Hz renders, not 1000."""
    from dgemma.events import RequestEvent

    clock = Clock(0.0)
    pending = [RequestEvent(i % 4, "running") for i in range(1000)] + [RequestEvent(i, "done") for i in range(4)]

    def poll(timeout):
        clock.now += min(timeout, 0.002) if timeout > 0 else 0.002  # 2 ms per event
        return [pending.pop(0)] if pending else []

    drawn = boards_of(poll, 6.0, clock)
    assert drawn[-1] == (1004, True)  # every event folded, none dropped
    assert 8 <= len(drawn) <= 14, len(drawn)


def test_ticks_hand_out_an_unchanged_board_every_keepalive_so_a_gone_client_is_noticed():
    """Requests that only wait (no events for 3 s): the board still comes out about every 0.5 s."""
    from dgemma.events import RequestEvent

    clock = Clock(0.0)

    def poll(timeout):
        clock.now += max(timeout, 0.01)
        if clock.now < 0.05:
            return [RequestEvent(0, "queued")]
        return [RequestEvent(0, "done")] if clock.now >= 3.0 else []

    drawn = boards_of(poll, 6.0, clock)
    assert 5 <= len(drawn) <= 8, len(drawn)  # 3 s / 0.5 s, plus the first and the last
    assert drawn[-1][1]


def test_a_failure_outside_any_request_ends_every_open_card_with_its_sentence():
    from dgemma.events import RequestEvent
    from dgemma.ui.board import fail_unfinished, fold

    board = fold([RequestEvent(1, "queued", prompt="a"), RequestEvent(2, "running", prompt="b"),
                  RequestEvent(3, "done", prompt="c", text="ok")])
    fail_unfinished(board, "The GPU run failed: out of time.")
    assert board.finished and [v.status for v in board.requests.values()] == ["error", "error", "done"]
    rows = frame(board)["rows"]
    assert [r["label"] for r in rows][:2] == ["error: The GPU run failed: out of time."] * 2
    assert rows[2]["text"] == "ok"  # what a finished card showed stays


def test_the_header_says_what_the_teaching_model_can_do_and_only_for_it():
    from dgemma.ui.loading_tick import header_markdown as _header

    facts = {"model": "assets/model", "vocab_size": 45, "canvas_length": 16, "parameters": 1_100_000}
    assert "teaching model knows counting" in _header({**facts, "embedded": True}, 32)
    assert "teaching model knows" not in _header({**facts, "embedded": False}, 32)


def test_a_card_shows_its_note_and_only_its_own():
    from dgemma.events import RequestEvent
    from dgemma.ui.board import fold

    board = fold([RequestEvent(1, "queued", prompt="what is 2+2?"), RequestEvent(2, "queued", prompt="add 12+34")])
    board.notes = {1: "The teaching model only knows its task families."}
    assert [r["note"] for r in frame(board)["rows"]] == ["The teaching model only knows its task families.", ""]

# ---------------------------------------------------------------- real events from the real engine

import dataclasses  # noqa: E402
import math  # noqa: E402

import plotly.graph_objects as go  # noqa: E402

from dgemma.events import RequestEvent, StepEvent, TilePlan  # noqa: E402
from dgemma.ui.board import Board, RequestView, fold  # noqa: E402
from dgemma.ui.compact import CELLS, MAX_CELL, frame, row, shown_piece, status_text  # noqa: E402
from dgemma.ui.charts import COLORS, ENTROPY_FLOOR, board_tile_figure, entropy_figure, mark_step, plot, tile_figure  # noqa: E402

PROMPTS = ["The cat <b>sat</b> & ran", "Once upon a time", "The sky is", "Two plus two is", "A", "B"]
MAX_STEPS = 3


@pytest.fixture(scope="module")
def engine_events(tiny_model):
    """Every event one subscription saw: 6 prompts on 4 slots (so some wait), 2 canvases each."""
    from dgemma.engine import Engine, EngineConfig
    from dgemma.sampling import SamplingParams

    engine = Engine(tiny_model, EngineConfig(max_num_seqs=4, tiling=2)).start()
    try:
        mailbox = engine.subscribe("render-test")
        handles = [
            engine.submit(p, SamplingParams(max_denoising_steps=MAX_STEPS, seed=10 + i),
                          2 * tiny_model.canvas_length, subscriber="render-test")
            for i, p in enumerate(PROMPTS)
        ]
        events = []
        # Read as the UI does, while the engine runs (a reader that falls behind sees merged frames).
        while not all(h.done for h in handles):
            events += mailbox.poll(0.05)
        while batch := mailbox.poll(0.2):
            events += batch
    finally:
        engine.shutdown()
    return events, [h.result() for h in handles], tiny_model.canvas_length


def test_fold_keeps_every_request_and_plan(engine_events):
    events, finals, _ = engine_events
    board = fold(events)
    assert [v.request_id for v in board.requests.values()] == [f.request_id for f in finals]
    assert board.finished
    for final in finals:
        view = board.requests[final.request_id]
        assert view.status == "done" and view.committed_text == final.text
        assert view.prompt == final.prompt and view.seed == final.seed
        xs = [x for x, _ in view.entropy_curve]
        assert xs == sorted(set(xs)) and xs[-1] == final.steps == view.steps  # true step counts
    assert board.plan_count == sum(isinstance(e, TilePlan) for e in events) > 0
    assert board.confidence_threshold == 0.005  # the sampler default every StepEvent carried


def test_cards_show_queued_live_and_committed_states(engine_events):
    events, finals, cl = engine_events
    # Replay the stream and look at the page at three moments.
    first_step = next(i for i, e in enumerate(events) if isinstance(e, StepEvent))
    board = fold(events[:first_step + 1])
    step: StepEvent = events[first_step]
    card = row(board.requests[step.request_id], cl)
    assert len(card["cells"]) == cl
    assert sum(c in CELLS["accepted"] for c in card["cells"]) == sum(step.accepted)
    assert sum(c in CELLS["noise"] for c in card["cells"]) == cl - sum(step.accepted)
    assert f"step {step.step} of {MAX_STEPS}" in card["label"] and card["step"] == step.step
    # More prompts than slots: someone is still queued when the first step lands.
    assert any(r["label"] == "queued" for r in frame(board)["rows"])

    commit = next(i for i, e in enumerate(events) if isinstance(e, RequestEvent) and e.status == "committed")
    board = fold(events[:commit + 1])
    view = board.requests[events[commit].request_id]
    assert view.committed_text == events[commit].text and view.last_step is None
    assert row(view, cl)["text"] == view.committed_text and row(view, cl)["step"] is None

    rows = frame(fold(events))["rows"]
    assert [r["status"] for r in rows] == ["done"] * len(finals)
    assert rows[0]["prompt"] == PROMPTS[0]  # text: the browser escapes it where it draws it


def test_entropy_figure_has_a_line_per_request_and_the_threshold(engine_events):
    events, finals, _ = engine_events
    board = fold(events)
    spec = entropy_figure(board)
    go.Figure(spec)  # a valid Plotly figure
    assert len(spec["data"]) == len(finals)
    for i, (trace, final) in enumerate(zip(spec["data"], finals, strict=True)):
        assert trace["name"] == f"#{i + 1}" and trace["x"][-1] == final.steps  # prompt i+1 of the run
        assert min(trace["y"]) >= ENTROPY_FLOOR
    assert spec["layout"]["yaxis"]["type"] == "log"
    (line,) = spec["layout"]["shapes"]
    assert line["y0"] == pytest.approx(board.confidence_threshold)
    assert plot(spec).plot.startswith('{"data"')


@pytest.mark.parametrize("threshold", [1e-9, 0.005, 0.0])
def test_the_confidence_axis_fits_its_labels_and_the_thresholds_label_sits_on_its_line(engine_events, threshold):
    """At step 0 of a replay nothing but the threshold is drawn: an axis left to Plotly spanned that one
    value, with one long label ("0.000000001") over the axis title, and the threshold's label apart from
    its line. The axis spans two decades at least, its labels are powers of ten kept inside the chart, and
    the label sits on the line with half a decade above it for its text; so too once every curve is drawn."""
    events, _, _ = engine_events
    for board in (Board(confidence_threshold=threshold), fold(events)):
        board.confidence_threshold = threshold
        spec = entropy_figure(board)
        go.Figure(spec)
        axis = spec["layout"]["yaxis"]
        low, high = axis["range"]
        assert high - low >= 2 and axis["exponentformat"] == "power" and axis["automargin"] is True
        (line,), (label,) = spec["layout"]["shapes"], spec["layout"]["annotations"]
        assert label["y"] == pytest.approx(math.log10(line["y0"]))  # a log axis places an annotation in decades
        assert line["y0"] == (threshold or ENTROPY_FLOOR) and low < label["y"] <= high - 0.5
        assert all(low < math.log10(y) < high for trace in spec["data"] for y in trace["y"])


def test_past_twelve_requests_the_confidence_chart_draws_a_trace_a_colour_and_marks_every_lines_end():
    """32 requests redraw as 10 traces (a replay's last step redraws the chart while the page waits):
    each line kept whole, None between two requests', and the step's marker at every line's end."""
    board = Board(confidence_threshold=0.005)
    for i in range(32):
        board.requests[i] = RequestView(i, index=i + 1, entropy_curve=[(1, 2.0 + i), (2, 1.0 + i)])
    spec = mark_step(entropy_figure(board), 2, (0, 2), "step 2", now=True)
    go.Figure(spec)
    lines = [t for t in spec["data"] if t["mode"] == "lines"]
    assert len(lines) == len(COLORS) and not any(t["showlegend"] for t in lines)
    first = lines[0]  # requests 1, 11, 21 and 31, one colour
    assert first["x"] == [1, 2, None] * 3 + [1, 2] and first["text"][:2] == ["#1", "#1"] and first["text"][3] == "#11"
    assert first["y"][3:5] == [12.0, 11.0]  # request 11's line, after the gap
    (ends,) = [t for t in spec["data"] if t["mode"] == "markers"]
    assert sorted(ends["y"]) == [1.0 + i for i in range(32)] and set(ends["x"]) == {2}


def test_tile_figure_shows_every_call(engine_events):
    events, _, _ = engine_events
    plans = [e for e in events if isinstance(e, TilePlan)]
    spec = tile_figure(plans)
    go.Figure(spec)
    def trace(prefix: str) -> dict:  # names may carry a note, e.g. "peak transient (MiB, calibrated estimate)"
        (found,) = [t for t in spec["data"] if t["name"].startswith(prefix)]
        return found

    assert trace("requests denoising")["y"] == [p.num_decode for p in plans]
    assert trace("tiles per call")["y"] == [len(p.tiles) for p in plans]
    assert max(trace("tile size")["y"]) <= 2  # tiling=2
    assert trace("peak transient")["y"] == [max(1e-3, round(p.peak_transient_bytes / 2**20, 4)) for p in plans]
    assert spec["layout"]["yaxis2"]["type"] == "log"  # GiB free on the host next to KiB transients
    narrow = [dataclasses.replace(p, free_bytes=4 * 2**20, peak_transient_bytes=2**20) for p in plans]
    assert "type" not in tile_figure(narrow)["layout"]["yaxis2"]  # a budget: same order, linear axis
    assert board_tile_figure(fold(events))["data"][0]["x"][0] == 1
    assert all(t["type"] == "scatter" for t in spec["data"])  # lines: cheap live redraws


def test_status_text_for_every_state(engine_events):
    events, _, _ = engine_events
    board = fold(events)
    view = next(iter(board.requests.values()))
    assert status_text(view) == "done"
    view.status, view.error = "error", "out of memory: the sampler step does not fit"
    assert status_text(view) == "error: out of memory: the sampler step does not fit"


def test_a_preempted_request_starts_its_card_over_and_says_why(engine_events):
    events, _, _ = engine_events
    commit = next(i for i, e in enumerate(events) if isinstance(e, RequestEvent) and e.status == "committed")
    request_id = events[commit].request_id
    # What the engine emits when it gives this request's memory back (tests/test_engine.py makes it happen).
    preempted = RequestEvent(request_id, "queued", extra=dict(preempted="preempted to free memory (...)"))
    board = fold([*events[: commit + 1], preempted])
    view = board.requests[request_id]
    assert (view.committed_text, view.canvases, view.steps, view.entropy_curve) == ("", 0, 0, [])
    assert status_text(view) == "queued again: preempted to free memory"
    later = fold([*events[: commit + 1], preempted, *events[commit + 1 :]])
    assert later.requests[request_id].status == "done"  # it finishes like any other


def test_a_finished_card_carries_its_whole_text_and_what_refine_needs(engine_events):
    events, finals, cl = engine_events
    board = fold(events)
    for final in finals:
        card = row(board.requests[final.request_id], cl)
        assert card["text"] == final.text and card["refine"] == 1 and card["seed"] == final.seed


def test_word_pieces_show_spaces_mark_special_tokens_and_clip_long_pieces():
    assert shown_piece("▁the") == " the"
    long = "▁" + "supercalifragilistic"
    assert shown_piece(long) == " supercalif…" and len(shown_piece(long)) == MAX_CELL
    assert shown_piece("<start_of_turn>") == "◆"


def test_special_and_invisible_pieces_take_one_visible_cell():
    assert [shown_piece(p) for p in ("<pad>", "<eos>", "<bos>", "<unk>", "<x_y>")] == ["▫", "■", "▸", "?", "◆"]
    assert [shown_piece(p) for p in (" ", "\n", "", "<", "&")] == [" ", "↵", "∅", "<", "&"]


def lesson_runs(tiny_model, n: int, real_scale: bool, steps: int) -> dict:
    """The lesson's runs under its suggested budget, on an engine of the tiny model."""
    from dgemma.engine import EngineConfig
    from dgemma.serving.engine_backend import EngineBackend
    from dgemma.settings import Limits
    from dgemma.serving.runs import RunService
    from dgemma.ui.lesson.tab import run_lesson

    backend = EngineBackend(tiny_model, EngineConfig(max_num_seqs=n), Limits(), None)
    try:
        runs = {}
        for _ in run_lesson(RunService(backend), None, n, backend.suggest_budget(n, real_scale), real_scale, steps, runs):
            pass
        return runs
    finally:
        backend.close()


def test_lesson_budget_makes_untiled_fail_and_tiles_fit(tiny_model):
    n = 16
    runs = lesson_runs(tiny_model, n, False, 2)
    untiled, tiled = runs["untiled"], runs["tiled"]
    assert not untiled.ok and untiled.needed_bytes > untiled.free_bytes  # one tile of all 16 cannot fit: the OOM
    plan = tiled.plans[0]
    assert tiled.ok and 2 <= plan.group < n and plan.group * plan.bytes_per_request <= plan.free_bytes / 2  # tiles do


def test_lesson_chunked_sampler_untiled_completes_where_the_reference_runs_out(tiny_model):
    """The lesson's third run (real scale): same batch, same budget, one tile, the chunked step fits."""
    runs = lesson_runs(tiny_model, 4, True, 1)
    reference, chunked, tiled = runs["untiled"], runs["chunked"], runs["tiled"]
    assert not reference.ok
    assert chunked.ok and all(len(p.tiles) == 1 for p in chunked.plans)
    assert chunked.tokens == tiled.tokens
