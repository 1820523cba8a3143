"""The "Tiling vs OOM" tab: one batch, one memory budget, run untiled and then tiled.

Untiled, the sampler step holds ~2 fp32 [requests x CL x vocab] copies at once (~1 on a CPU at a
large vocabulary: it takes a few positions at a time through its cache) and runs out of
memory (a real torch.OutOfMemoryError: the CUDA allocator under a per-process cap, or the
budgeted virtual device on a CPU). Tiled, the same batch runs a few requests at a time and
completes. Then the page checks the tokens: the tiled run against an untiled rerun with room
to spare. Rendering (outcome -> HTML) is pure and lives here with the tab's components.
"""

from __future__ import annotations

import html
from collections.abc import Iterator
from dataclasses import dataclass

import gradio as gr

from dgemma.errors import SettingsError
from dgemma.gpus import RELEASED_VOCAB as REAL_VOCAB
from dgemma.serving.backend import Backend, LessonOutcome
from dgemma.serving.inputs import parse_call_settings
from dgemma.ui.charts import plot, tile_figure
from dgemma.ui.lesson import explorer
from dgemma.ui.lesson import steps as lesson_steps
from dgemma.units import format_bytes

UNTILED, TILED, CHUNKED = "Untiled (one tile)", "Tiled (auto)", "Chunked sampler, untiled (one tile)"
PENDING = '<div class="lesson-result">running…</div>'
COMPARING = '<div class="lesson-result">comparing tokens with an untiled rerun that has room…</div>'
INTRO = (
    "### Why many canvases run out of memory, and how tiling fixes it\n"
    "One denoising step works in fp32 over `[requests × canvas length, vocab]` logits and, in eager "
    "PyTorch, holds about **2 copies** of that tensor at its peak (the seed's step held 7; a CPU, which takes a few "
    "positions at a time through its cache, holds 1 at the released vocabulary). With many requests the *sampler* "
    "runs out of memory before the weights or the cache do. Tiling runs the step a few requests at "
    "a time, sized from free memory, so the peak shrinks by the number of tiles, and because each "
    "request's randomness is keyed by (seed, canvas, step), the tokens do not change."
)
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
    run: gr.Button
    untiled: gr.HTML
    tiled: gr.HTML
    chunked: gr.HTML
    verdict: gr.HTML
    chart: gr.Plot
    stepper: lesson_steps.Stepper


def render_outcome(outcome: LessonOutcome | None, title: str) -> str:
    """One run's result box: the OOM with its numbers, or the tiles it ran."""
    if outcome is None:
        return f'<div class="lesson-result"><b>{html.escape(title)}</b>: not run yet.</div>'
    if outcome.ok:
        tiles = [len(p.tiles) for p in outcome.plans]
        peak = max((p.peak_transient_bytes for p in outcome.plans), default=0)
        detail = (
            f"{len(outcome.plans)} sampler calls, up to {max(tiles, default=0)} tiles per call, "
            f"peak transient {format_bytes(peak)}, {outcome.seconds:.1f} s."
        )
        return (
            f'<div class="lesson-result ok" data-outcome="ok"><b>{html.escape(title)}: completed.</b> '
            f"{html.escape(outcome.message)} {detail}</div>"
        )
    numbers = ""
    if outcome.needed_bytes or outcome.free_bytes:
        numbers = (f" Needed {format_bytes(outcome.needed_bytes)} (the measured peak of one tile of all requests), "
                   f"free {format_bytes(outcome.free_bytes)}.")
    detail = f'<br><small>allocator: {html.escape(outcome.detail)}</small>' if outcome.detail else ""
    return (
        f'<div class="lesson-result oom" data-outcome="oom"><b>{html.escape(title)}: out of memory.</b> '
        f"{html.escape(outcome.message)}{numbers}{detail}</div>"
    )


def render_chunked(outcome: LessonOutcome | None) -> str:
    """The third run's box; without real scale it explains why it was not run."""
    if outcome is not None:
        return render_outcome(outcome, CHUNKED)
    return (
        f'<div class="lesson-result" data-outcome="skipped"><b>{html.escape(CHUNKED)}</b>: runs with '
        "<i>real scale</i> on. The chunked step streams the vocabulary and keeps per-position running sums "
        "and a [CL, hidden] soft-embedding accumulator; at this model's tiny vocabulary those outweigh the "
        "logits themselves, so chunking only pays at real vocabularies.</div>"
    )


def _chunked_note(chunked: LessonOutcome | None, reference: LessonOutcome) -> str:
    """One sentence: did the chunked step, untiled, commit the reference step's tokens?"""
    if chunked is None or not chunked.ok:
        return ""
    same = sum(reference.tokens.get(i) == t for i, t in chunked.tokens.items())
    return (f" The chunked step, untiled under the same budget, committed the same token ids for {same} of "
            f"{len(chunked.tokens)} requests.")


def render_verdict(tiled: LessonOutcome, reference: LessonOutcome, chunked: LessonOutcome | None = None) -> str:
    """Whether the tiled (and chunked) runs' tokens equal the untiled reference's, request by request."""
    if not (tiled.ok and reference.ok):
        why = tiled.message if not tiled.ok else reference.message
        return f'<div class="lesson-result oom">Tokens not compared: {html.escape(why)}</div>'
    same = [i for i in tiled.tokens if reference.tokens.get(i) == tiled.tokens[i]]
    n = len(tiled.tokens)
    if len(same) == n and n == len(reference.tokens):
        return (
            f'<div class="lesson-result same" data-outcome="identical"><b>Identical tokens.</b> All {n} requests '
            "committed the same token ids tiled as untiled (the untiled rerun had a budget large enough "
            f"for a single tile).{html.escape(_chunked_note(chunked, reference))}</div>"
        )
    differ = sorted(set(tiled.tokens) - set(same))
    return (
        f'<div class="lesson-result oom" data-outcome="different"><b>Tokens differ</b> for requests '
        f"{', '.join(map(str, differ[:10]))}: {len(same)} of {n} identical.</div>"
    )


def build(backend: Backend) -> LessonParts:
    """The tab's components (call inside `with gr.Tab(...)`)."""
    gr.Markdown(INTRO)
    with gr.Row():
        requests = gr.Slider(2, max(2, backend.max_num_seqs), value=min(16, backend.max_num_seqs), step=1,
                             label="requests in the batch")
        budget = gr.Textbox(backend.info().get("lesson_budget", "256MiB"), label="memory budget",
                            info="weights + cache + the sampler's transient must fit (e.g. 256MiB, 2GiB)",
                            elem_id="lesson-budget")
        steps = gr.Number(8, label="denoising steps per canvas", precision=0, minimum=1, maximum=48)
        real_scale = gr.Checkbox(
            False, label=f"real scale: pad the logits to vocab {REAL_VOCAB:,}",
            info="The released model's vocabulary: the sampler's memory is real-size even with the small model. "
                 "On a CPU a real-scale step takes seconds: try 8 requests and 2-3 steps.",
        )
    run = gr.Button("Run untiled, then tiled, then chunked", variant="primary", elem_id="lesson-run")
    with gr.Row():
        untiled = gr.HTML(render_outcome(None, UNTILED), elem_id="lesson-untiled")
        tiled = gr.HTML(render_outcome(None, TILED), elem_id="lesson-tiled")
        chunked = gr.HTML(render_outcome(None, CHUNKED), elem_id="lesson-chunked")
    verdict = gr.HTML("", elem_id="lesson-verdict")
    with gr.Row():
        chart = gr.Plot(plot(tile_figure([])), label="tiled run", elem_id="lesson-plot", scale=2)
        gr.Markdown(CHART_TEXT, elem_classes="explain")
    stepper = lesson_steps.build()  # each run call by call: which requests each tile held, the memory
    gr.Markdown("The arithmetic behind these numbers, step by step: see `docs/tiling.md`.")
    explorer.section(backend)
    return LessonParts(requests, budget, real_scale, steps, run, untiled, tiled, chunked, verdict, chart, stepper)


def render_failure(title: str, sentence: str) -> str:
    """A run that could not happen: its card says why, in one sentence."""
    return (f'<div class="lesson-result oom" data-outcome="error"><b>{html.escape(title)}: not run.</b> '
            f"{html.escape(sentence)}</div>")


def budget_for_scale(backend: Backend, requests: int, budget: str, real_scale: bool) -> str:
    """The budget to run with. The box still holding the suggestion for the other scale (Run pressed
    before the new suggestion arrived) means this scale's suggestion: a budget is never run at the
    scale it was not meant for. Anything else the user typed is theirs."""
    text = (budget or "").strip()
    if text and text == backend.suggest_budget(requests, not real_scale):
        return backend.suggest_budget(requests, real_scale)
    return budget


def _checked(backend: Backend, n: float, steps: float):
    n = int(n)
    if not 1 <= n <= backend.max_num_seqs:
        raise SettingsError(f"The batch must hold between 1 and {backend.max_num_seqs} requests.")
    settings = parse_call_settings({"max_denoising_steps": steps}, backend.defaults, backend.limits,
                                   backend.max_num_seqs, prompts=n)
    return n, settings


def run_lesson(backend: Backend, n: float, budget: str, real: bool, steps: float,
               runs: lesson_steps.LessonRuns | None = None) -> Iterator[tuple]:
    """The tab's Run: untiled, tiled, (chunked,) then the token check, each card filled as it ends.
    A failure is one sentence on the card of the run it stopped; the cards before it stay. `runs`
    keeps the outcomes for stepping through them call by call."""
    runs = runs if runs is not None else lesson_steps.LessonRuns()
    runs.outcomes = {}
    cards = [render_outcome(None, UNTILED), render_outcome(None, TILED), render_outcome(None, CHUNKED), ""]
    chart, shown_budget, stage = gr.skip(), gr.skip(), 0

    def frame() -> tuple:
        return (*cards, chart, shown_budget)

    try:
        n, settings = _checked(backend, n, steps)
        ran = budget_for_scale(backend, n, budget, real)
        shown_budget = ran if ran != budget else gr.skip()
        cards[0] = PENDING
        yield frame()
        untiled = runs.outcomes["untiled"] = backend.lesson(n, ran, real, "off", settings)
        cards[0], cards[1], stage = render_outcome(untiled, UNTILED), PENDING, 1
        yield frame()
        tiled = runs.outcomes["tiled"] = backend.lesson(n, ran, real, "auto", settings)
        cards[1], chart, stage = render_outcome(tiled, TILED), plot(tile_figure(tiled.plans)), 2
        cards[2] = PENDING if real else render_chunked(None)
        yield frame()
        # The third way: the vocab-chunked step needs a fraction of one copy per request, so the
        # whole batch fits in one tile under the same budget -- at a real vocabulary. At the small
        # model's own, its [CL, hidden] accumulators outweigh the logits: nothing to show.
        chunked = backend.lesson(n, ran, real, "off", settings, impl="chunked") if real else None
        if chunked is not None:
            runs.outcomes["chunked"] = chunked
        cards[2], cards[3], stage = render_chunked(chunked), COMPARING, 3
        yield frame()
        reference = untiled if untiled.ok else backend.lesson(n, None, real, "off", settings)
        cards[3] = render_verdict(tiled, reference, chunked)
    except (ValueError, TypeError, gr.Error) as err:  # bad input, or the GPU call refused or failed
        sentence = err.message if isinstance(err, gr.Error) else str(err)
        if stage < 3:
            cards[stage] = render_failure((UNTILED, TILED, CHUNKED)[stage], sentence)
        else:
            cards[3] = f'<div class="lesson-result oom" data-outcome="error">Tokens not compared: {html.escape(sentence)}</div>'
    yield frame()


def wire(backend: Backend, parts: LessonParts) -> None:
    def suggest(n: float, real: bool) -> str:
        return backend.suggest_budget(int(n), bool(real))

    parts.requests.change(suggest, [parts.requests, parts.real_scale], parts.budget, api_visibility="private")
    parts.real_scale.change(suggest, [parts.requests, parts.real_scale], parts.budget, api_visibility="private")
    def run(n: float, budget: str, real: bool, steps: float, runs: lesson_steps.LessonRuns) -> Iterator[tuple]:
        yield from run_lesson(backend, n, budget, real, steps, runs)

    parts.run.click(
        run,
        [parts.requests, parts.budget, parts.real_scale, parts.steps, parts.stepper.state],
        [parts.untiled, parts.tiled, parts.chunked, parts.verdict, parts.chart, parts.budget],
        api_name="lesson", api_visibility="undocumented",
        concurrency_limit=1,  # the lesson allocates on purpose: one at a time, whoever asks
    ).then(*lesson_steps.wire(parts.stepper, parts.chart), show_progress="hidden", api_visibility="private")
