"""The "Tiling vs OOM" tab: one batch under one memory budget, run untiled (a real
torch.OutOfMemoryError), tiled and chunked as ordinary runs (`RunService.stream`), each run's canvases
live in the same board view as the Generate tab's; then its tokens against an untiled rerun with room."""

from __future__ import annotations

import html
import time
from collections.abc import Generator, Iterator
from contextlib import closing
from dataclasses import dataclass, replace

import gradio as gr

from dgemma.examples import lesson_prompts
from dgemma.gpus import RELEASED_VOCAB
from dgemma.recording import Recording
from dgemma.serving.backend import Backend
from dgemma.serving.runs import RunService
from dgemma.settings import BY_NAME, RunRequest, make_request
from dgemma.ui import board_view
from dgemma.ui.board import Board
from dgemma.ui.charts import plot, tile_figure
from dgemma.ui.lesson import explorer
from dgemma.ui.lesson import steps as lesson_steps
from dgemma.ui.lesson.outcomes import CHUNKED, COMPARING, PENDING, TILED, UNTILED, LessonOutcome, summarize
from dgemma.ui.lesson.outcomes import render_chunked, render_failure, render_not_compared, render_outcome, render_verdict
from dgemma.ui.slider import Slider

INTRO = (
    "### Why many canvases run out of memory, and how tiling fixes it\n"
    "One denoising step works in fp32 over `[requests × canvas length, vocab]` logits and, in eager "
    "PyTorch, holds about **2 copies** of that tensor at its peak (the seed's step held 7; a CPU, which takes a few "
    "positions at a time through its cache, holds 1 at the released vocabulary). With many requests the *sampler* "
    "runs out of memory before the weights or the cache do. Tiling runs the step a few requests at "
    "a time, sized from free memory, so the peak shrinks by the number of tiles, and because each "
    "request's randomness is keyed by (seed, canvas, step), the tokens do not change."
)
LESSON_STEPS = 48  # the tab's own cap on a canvas's denoising steps: a lesson run stays short
IDLE = '<div class="lesson-board-title">Press <b>Run</b>: each run\'s canvases denoise here, one row per request.</div>'
CHART_TEXT = (
    "**The tiled run, call by call.** Grey area: requests denoising; blue: requests per tile; dotted "
    "orange: tiles per call. Right axis: free memory before the call, the measured peak the call allocated, "
    "and the budget. The peak stays under the budget because no tile holds more than half of what is free."
)


@dataclass
class LessonParts:
    requests: gr.Slider
    budget: gr.Textbox
    real_scale: gr.Checkbox
    steps: gr.Number
    scheduler: gr.Dropdown
    run: gr.Button
    untiled: gr.HTML
    tiled: gr.HTML
    chunked: gr.HTML
    verdict: gr.HTML
    chart: gr.Plot
    stepper: lesson_steps.Stepper
    board_title: gr.HTML
    board: gr.HTML


def build(backend: Backend) -> LessonParts:
    """The tab's components (call inside `with gr.Tab(...)`)."""
    gr.Markdown(INTRO)
    with gr.Row():
        requests = Slider(2, max(2, backend.max_num_seqs), value=min(16, backend.max_num_seqs), step=1,
                          label="requests in the batch", elem_id="lesson-requests")
        budget = gr.Textbox(backend.info().get("lesson_budget", "256MiB"), label="memory budget",
                            info="weights + cache + the sampler's transient must fit (e.g. 256MiB, 2GiB)",
                            elem_id="lesson-budget")
        steps = gr.Number(8, label="denoising steps per canvas", precision=0,  # a bad value: one sentence (the door's)
                          elem_id="lesson-denoising-steps")
        # Each scheduler holds its own transient per request (at its defaults, the entropy bound's);
        # the budget's suggestion is for that one row.
        scheduler = gr.Dropdown(list(BY_NAME["scheduler"].choices), value=backend.defaults.value("scheduler"),
                                label="scheduler", info="every run of the lesson denoises with it, at its defaults",
                                elem_id="lesson-scheduler")
        real_scale = gr.Checkbox(
            False, elem_id="lesson-real-scale", label=f"real scale: pad the logits to vocab {RELEASED_VOCAB:,}",
            info="The released model's vocabulary: the sampler's memory is real-size even with the small model. "
                 "On a CPU a real-scale step takes seconds: try 8 requests and 2-3 steps.")
    run = gr.Button("Run untiled, then tiled, then chunked", variant="primary", elem_id="lesson-run")
    with gr.Row():
        untiled = gr.HTML(render_outcome(None, UNTILED), elem_id="lesson-untiled")
        tiled = gr.HTML(render_outcome(None, TILED), elem_id="lesson-tiled")
        chunked = gr.HTML(render_outcome(None, CHUNKED), elem_id="lesson-chunked")
    verdict = gr.HTML("", elem_id="lesson-verdict")
    board_title = gr.HTML(IDLE, elem_id="lesson-board-title")  # which run the board shows, live
    board = board_view.build(elem_id="lesson-board")  # the overview of the batch, and its cards
    with gr.Row():
        chart = gr.Plot(plot(tile_figure([])), label="tiled run", elem_id="lesson-plot", scale=2)
        gr.Markdown(CHART_TEXT, elem_classes="explain")
    stepper = lesson_steps.build()  # each run call by call: which requests each tile held, the memory
    gr.Markdown("The arithmetic behind these numbers, step by step: see `docs/tiling.md`.")
    explorer.section(backend)
    return LessonParts(requests, budget, real_scale, steps, scheduler, run, untiled, tiled, chunked, verdict, chart, stepper,
                       board_title, board)


def budget_for_scale(backend: Backend, requests: int, budget: str, real_scale: bool) -> str:
    """The budget to run with. The box still holding the suggestion for the other scale (Run pressed
    before the new suggestion arrived) means this scale's suggestion: a budget is never run at the
    scale it was not meant for. Anything else the user typed is theirs."""
    text = (budget or "").strip()
    if text and text == backend.suggest_budget(requests, not real_scale):
        return backend.suggest_budget(requests, real_scale)
    return budget


def lesson_call(backend: Backend, n: float, steps: float | None, scheduler: str | None, budget: str | None,
                tiling: str = "off", impl: str = "reference", real: bool = False) -> RunRequest:
    """One run of the lesson through the door, under the tab's own cap of LESSON_STEPS: its `n` prompts, one
    canvas each, the `scheduler` at its defaults (None: the server's), the `budget` (None: none of its own),
    `tiling` and step `impl`; over defaults where a tile out of memory fails the run and real scale pads the
    logits to the released vocabulary (no front end's settings)."""
    defaults = replace(backend.defaults, options=replace(backend.defaults.options, fail_on_oom=True,
                                                         pad_vocab=RELEASED_VOCAB if real else None))
    length = min(backend.limits.max_new_tokens, int(backend.info().get("canvas_length") or 0) or backend.limits.max_new_tokens)
    raw = {"max_denoising_steps": steps, "max_new_tokens": length, "scheduler": scheduler,
           "memory_budget": (budget or "").strip() or None, "tiling": tiling, "sampler": impl}
    return make_request(lesson_prompts(int(n)), raw, defaults, replace(backend.limits, max_denoising_steps=LESSON_STEPS),
                        backend.max_num_seqs, backend.canvas_model)


def watch(service: RunService, request: object, call: RunRequest,
          title: str | None) -> Generator[dict, None, LessonOutcome]:
    """One run of `call` for the request's tab, as the tab's outputs while it runs (by LessonParts' names): its board (as its
    page can take it) under the `title` (None: the board keeps the last run's, as for the rerun behind
    the verdict); then its outcome, read from every event the run sent. A run that cannot start or whose
    stream fails: ValueError, one sentence."""
    recording, board, started = Recording(), Board(), time.monotonic()
    heading = (f'<div class="lesson-board-title"><b>{html.escape(title)}</b>, live: {len(call.prompts)} requests, one '
               "row each, one cell per canvas position.</div>") if title else None
    # No frame until this run's first step arrives: the last run's board stays until then. No Refine
    # on the lesson's cards, nor its data.
    frames = board_view.frames(service.stream(request, call), board, refine=False,
                               draw=lambda board: bool(title and (board.canvas_length or board.finished)))
    with closing(frames):
        for tick, shown in frames:
            recording.extend(tick.events)  # for the outcome and the step-through
            # A failure's frame (every card it stopped says so) goes only on a titled run's board.
            if not tick.failure or (title and shown is not None):
                yield {name: v for name, v in (("board_title", heading), ("board", shown)) if v is not None}
                heading = None
            if tick.failure:  # then the tab's card of this run says why
                raise ValueError(tick.failure)
    return summarize(recording.events(), time.monotonic() - started, call.settings.options.memory_budget)


def run_lesson(service: RunService, request: object, n: float, budget: str, real: bool, steps: float,
               runs: dict[str, LessonOutcome] | None = None, scheduler: str | None = None) -> Iterator[dict]:
    """The tab's Run: untiled, tiled, (chunked,) then the token check, each card filled as it ends and
    each run's canvases drawn live as it goes. A failure is one sentence on the card of the run it
    stopped; the cards before it stay. `runs` keeps the outcomes for stepping through them call by call."""
    backend = service.backend
    runs = runs if runs is not None else {}
    runs.clear()
    titles = {"untiled": UNTILED, "tiled": TILED, "chunked": CHUNKED}  # each run's card, by LessonParts' names
    cards = {**{name: render_outcome(None, title) for name, title in titles.items()}, "verdict": ""}
    chart, shown_budget, stage = None, None, "untiled"

    def outputs() -> dict:  # by LessonParts' names: the cards, and the chart and the budget once they change
        return {**cards, **{name: v for name, v in (("chart", chart), ("budget", shown_budget)) if v is not None}}

    def watched(title: str | None, budget: str | None, tiling: str, impl: str = "reference"):
        return (yield from watch(service, request, lesson_call(backend, n, steps, scheduler, budget, tiling, impl, real),
                                 title))

    try:
        ran = budget_for_scale(backend, int(n), budget, real)
        shown_budget = ran if ran != budget else None
        untiled_call = lesson_call(backend, n, steps, scheduler, ran, real=real)  # a mistake: on the first card
        cards["untiled"] = PENDING
        yield outputs()
        untiled = runs["untiled"] = yield from watch(service, request, untiled_call, UNTILED)
        cards["untiled"], cards["tiled"], stage = render_outcome(untiled, UNTILED), PENDING, "tiled"
        yield outputs()
        tiled = runs["tiled"] = yield from watched(TILED, ran, "auto")
        cards["tiled"], chart, stage = render_outcome(tiled, TILED), plot(tile_figure(tiled.plans)), "chunked"
        cards["chunked"] = PENDING if real else render_chunked(None)
        yield outputs()
        # The third way: the vocab-chunked step needs a fraction of one copy per request, so the
        # whole batch fits in one tile under the same budget -- at a real vocabulary. At the small
        # model's own, its [CL, hidden] accumulators outweigh the logits: nothing to show.
        chunked = (yield from watched(CHUNKED, ran, "off", "chunked")) if real else None
        if chunked is not None:
            runs["chunked"] = chunked
        cards["chunked"], cards["verdict"], stage = render_chunked(chunked), COMPARING, "verdict"
        yield outputs()
        reference = untiled if untiled.ok else (yield from watched(None, None, "off"))
        cards["verdict"] = render_verdict(tiled, reference, chunked)
    except (ValueError, TypeError, gr.Error) as err:  # bad input, a run refused, or the GPU call failed
        sentence = err.message if isinstance(err, gr.Error) else str(err)  # a budget too small names the one to type
        cards[stage] = render_failure(titles[stage], sentence) if stage in titles else render_not_compared(sentence)
    yield outputs()


def wire(service: RunService, parts: LessonParts) -> None:
    backend = service.backend

    def suggest(n: float, real: bool) -> str:
        return backend.suggest_budget(int(n), bool(real))

    gr.on([parts.requests.change, parts.real_scale.change], suggest, [parts.requests, parts.real_scale], parts.budget,
          api_visibility="private")

    def run(n: float, budget: str, real: bool, steps: float, scheduler: str, runs: dict[str, LessonOutcome],
            request: gr.Request) -> Iterator[dict]:
        for update in run_lesson(service, request, n, budget, real, steps, runs, scheduler):  # by name: the parts
            yield {getattr(parts, name): value for name, value in update.items()} or gr.skip()

    ran = parts.run.click(
        run,
        [parts.requests, parts.budget, parts.real_scale, parts.steps, parts.scheduler, parts.stepper.state],
        [parts.untiled, parts.tiled, parts.chunked, parts.verdict, parts.chart, parts.budget, parts.board_title,
         parts.board],
        api_name="lesson", api_visibility="undocumented",
        concurrency_limit=1)  # the lesson allocates on purpose: one at a time, whoever asks
    lesson_steps.wire(parts.stepper, parts.chart, ran)
