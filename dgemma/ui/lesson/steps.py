"""The lesson, call by call: step through its runs with a call slider and back / play / pause / forward.
At call k: which requests each tile held (tiles run in row order), each tile's calibrated transient,
the call's peak, free memory and the budget; the untiled run's last call is the one that ran out of memory."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

import gradio as gr

from dgemma.ui.charts import mark_step, plot, tile_figure
from dgemma.ui.ledger_chart import ledger_figure
from dgemma.ui.lesson.outcomes import TILED, UNTILED, LessonOutcome
from dgemma.ui.slider import Slider
from dgemma.units import format_bytes

RUNS = ((UNTILED, "untiled"), (TILED, "tiled"), ("Chunked, untiled", "chunked"))  # (label, the outcome's name)
LABELS = {name: label for label, name in RUNS}
PACE_S = 1.0  # seconds per call while playing


@dataclass
class Stepper:
    state: gr.State
    run: gr.Radio
    slider: gr.Slider
    back: gr.Button
    play: gr.Button
    pause: gr.Button
    forward: gr.Button
    view: gr.HTML
    memory: gr.Plot  # the run's memory ledger, a stacked bar per call (ui/ledger_chart.py)


def render_call(outcome: LessonOutcome | None, k: int) -> str:
    """Call k (1-based) of one run: its tiles, the requests in each, the memory."""
    if outcome is None or not outcome.calls:
        return '<div class="lesson-call">Run the lesson, then step through its sampler calls here.</div>'
    k = max(1, min(k, len(outcome.calls)))
    rows = outcome.calls[k - 1]
    plan = outcome.plans[k - 1] if k <= len(outcome.plans) else None
    head = f"<b>Call {k} of {len(outcome.calls)}</b>: {len(rows)} requests denoising"
    if plan is None:  # the call that raised torch.OutOfMemoryError: no plan came back
        return (f'<div class="lesson-call oom" data-call="{k}">{head} in <b>one tile</b> holding requests '
                f"{_requests(rows)}. It needs {format_bytes(outcome.needed_bytes)} (calibrated) with "
                f"{format_bytes(outcome.free_bytes)} free: <b>out of memory</b>.</div>")
    items, start = [], 0
    for j, size in enumerate(plan.tiles):
        held = rows[start : start + size]
        start += size
        items.append(f"<li>tile {j + 1}: {size} requests, {_requests(held)} · about "
                     f"{format_bytes(size * plan.bytes_per_request)} ({format_bytes(plan.bytes_per_request)} each)</li>")
    peak = "measured peak" if plan.peak_measured else "calibrated peak"
    budget = f" · budget {format_bytes(plan.budget_bytes)}" if plan.budget_bytes else ""
    splits = f" · {len(plan.splits)} tiles ran out of memory and were split in half" if plan.splits else ""
    return (f'<div class="lesson-call ok" data-call="{k}">{head} in {len(plan.tiles)} '
            f"tile{'s' if len(plan.tiles) != 1 else ''} (planned {plan.group} per tile against "
            f"{format_bytes(plan.free_bytes)} free){splits}<ul>{''.join(items)}</ul>"
            f"{peak} of the call {format_bytes(plan.peak_transient_bytes)}{budget}</div>")


def _requests(rows: tuple[int, ...]) -> str:
    """Request numbers as the lesson's cards count them (#1 is row 0), ranges where consecutive."""
    parts, i = [], 0
    while i < len(rows):
        j = i
        while j + 1 < len(rows) and rows[j + 1] == rows[j] + 1:
            j += 1
        parts.append(f"#{rows[i] + 1}" if i == j else f"#{rows[i] + 1}–#{rows[j] + 1}")
        i = j + 1
    return ", ".join(parts)


def build() -> Stepper:
    """The controls (call inside the lesson's tab, under its results)."""
    state = gr.State(dict)  # the tab's last lesson: its outcomes by run (the names of RUNS)
    with gr.Row(elem_id="lesson-steps"):
        run = gr.Radio(list(RUNS), value="untiled", label="step through", scale=2, elem_id="lesson-step-run")
        slider = Slider(1, 2, value=1, step=1, label="sampler call", scale=3, elem_id="lesson-call-slider")
        with gr.Column(scale=2, min_width=300):
            with gr.Row():
                back = gr.Button("◀ back", size="sm", min_width=60, elem_id="lesson-back")
                play = gr.Button("▶ play", size="sm", min_width=60, elem_id="lesson-play")
                pause = gr.Button("❚❚ pause", size="sm", min_width=60, elem_id="lesson-pause")
                forward = gr.Button("forward ▶", size="sm", min_width=60, elem_id="lesson-forward")
    with gr.Row(equal_height=False):
        view = gr.HTML(render_call(None, 1), elem_id="lesson-call")
        memory = gr.Plot(plot(ledger_figure([], "Memory per sampler call")), label="memory", elem_id="lesson-memory")
    return Stepper(state, run, slider, back, play, pause, forward, view, memory)


def wire(stepper: Stepper, chart: gr.Plot, ran: gr.events.Dependency) -> None:
    """The handlers, and the first call shown after a lesson `ran`. Play is one stream, as the Generate
    tab's; a hand on the controls ends it."""
    s = stepper

    def show(runs: dict[str, LessonOutcome], name: str, k: float) -> dict:
        outcome = runs.get(name)
        n = len(outcome.calls) if outcome is not None else 1
        k = max(1, min(int(k or 1), n))
        shown = {s.view: render_call(outcome, k), s.slider: gr.Slider(maximum=max(2, n), value=k)}
        if outcome is not None:  # its memory ledger, call by call: the untiled call's bar crosses the budget
            shown[s.memory] = plot(ledger_figure(outcome.ledgers(), f"{LABELS[name]}: memory per call", k, not outcome.ok))
        if name == "tiled" and outcome is not None and outcome.plans:  # the chart is the tiled run's
            shown[chart] = plot(mark_step(tile_figure(outcome.plans), k, (1, max(2, len(outcome.plans))), f"call {k}"))
        return shown

    def play(runs: dict[str, LessonOutcome], name: str, k: float) -> Iterator[dict]:
        n = len(runs[name].calls) if name in runs else 1
        first = 1 if int(k or 1) >= n else int(k or 1)  # at the end, play starts over
        for call in range(first, n + 1):
            if call > first:
                time.sleep(PACE_S)
            yield show(runs, name, call)

    inputs, outputs = [s.state, s.run, s.slider], [s.view, s.slider, chart, s.memory]
    quiet = dict(show_progress="hidden", api_visibility="private", concurrency_limit=None)
    playing = s.play.click(play, inputs, outputs, **quiet)
    stops = dict(cancels=[playing], **quiet)
    s.slider.input(show, inputs, outputs, trigger_mode="always_last", **stops)
    s.run.input(lambda r, n: show(r, n, 1), [s.state, s.run], outputs, **stops)
    s.back.click(lambda runs, name, k: show(runs, name, (k or 1) - 1), inputs, outputs, **stops)
    s.forward.click(lambda runs, name, k: show(runs, name, (k or 1) + 1), inputs, outputs, **stops)
    s.pause.click(None, None, None, **stops)
    ran.then(lambda r: show(r, "untiled", 1), [s.state], outputs, show_progress="hidden", api_visibility="private")
