"""The page, top to bottom: title, the Generate tab, the Tiling-vs-OOM tab, and the API.

Reads like Gradio's own demos: components first, then the events that wire them. All work is
delegated: settings are checked by dgemma/settings.py, runs go through the Backend, frames come from
stream.py, HTML from canvas.py, figures from charts.py, the lesson from lesson.py.
"""

from __future__ import annotations

import html
import logging
import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, fields

import gradio as gr

from dgemma.errors import SettingsError, first_line
from dgemma.recording import run_header
from dgemma.ui import api, lesson, playback
from dgemma.ui.backend import Backend
from dgemma.ui.board import FINAL, Board, fail_unfinished
from dgemma.ui.canvas import render_board
from dgemma.ui.charts import board_tile_figure, entropy_figure, plot
from dgemma.ui.examples import abilities, example_sets, prompt_note
from dgemma.ui.loading import LoadState
from dgemma.ui.sessions import Sessions, client_left
from dgemma.ui.settings import parse_call_settings, parse_prompts, prompts_from_text
from dgemma.ui.stream import frames

log = logging.getLogger(__name__)

# Seconds between redraws of one chart while a run streams (cards redraw every frame).
CHART_PERIOD_S = float(os.environ.get("DGEMMA_CHART_PERIOD_S", "1.0"))


ENTROPY_TEXT = (
    "**Confidence per step.** Each line is one request's mean token entropy after each denoising "
    "step. A canvas starts as random tokens (high entropy) and converges when its mean drops below "
    "the dashed threshold and its draft stops changing; then it is committed and the next canvas starts."
)
TILE_TEXT = (
    "**Tiles against free memory.** Each sampler call sees how much memory is free and groups the "
    "denoising requests into tiles that fit half of it. Grey area: requests denoising; blue: the "
    "largest tile; dotted orange: tiles per call; right axis: free memory, the measured peak transient, the budget."
)

SETTING_NAMES = (
    "max_new_tokens", "max_denoising_steps", "t_min", "t_max", "entropy_bound",
    "confidence_threshold", "stability_threshold", "seed", "greedy",
)  # fmt: skip


def _tiling(mode: str, fixed: float | None) -> str:
    if mode == "fixed":
        if fixed is None:
            raise SettingsError("Choose a tile size for fixed tiling.")
        return str(int(fixed)) if float(fixed).is_integer() else str(fixed)
    return mode


def _status(board: Board, started: float) -> str:
    counts: dict[str, int] = {}
    for view in board.requests.values():
        counts[view.status] = counts.get(view.status, 0) + 1
    parts = ", ".join(f"{n} {status}" for status, n in counts.items())
    return f"{parts} · {board.plan_count} sampler calls · {time.monotonic() - started:.1f} s"


def failed_status(sentence: str) -> str:
    """The status line after a failure: the one sentence, marked so it reads as one."""
    return f"⚠️ {sentence}"


def _count(n: int | None) -> str:
    if not n:
        return "?"
    for size, unit in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return str(n)


def header_facts(info: dict, memory_budget: str) -> str:
    """The facts line under the title: the same facts `/info` returns."""
    path = html.escape(str(info.get("model") or "?"))
    name = "the embedded teaching model" if info.get("embedded") else path.rstrip("/").rsplit("/", 1)[-1]
    vocab = info.get("vocab_size")
    return (
        f'<span title="{path}">Model: <b>{name}</b></span> · {_count(info.get("parameters"))} parameters · '
        f'{info.get("dtype")} on {info.get("device")} · vocab {vocab:,} · canvas {info.get("canvas_length")} tokens · '
        f"up to {info.get('max_num_seqs')} requests at once · memory budget {memory_budget}"
        if isinstance(vocab, int) else f"Model: {name} (loading …)"
    )


def _header(facts: dict, max_num_seqs: int) -> str:
    """The page's title block from a backend's `info()`."""
    note = f"<br>{facts['note']}" if facts.get("note") else ""  # e.g. what one click means on ZeroGPU
    knows = abilities(facts)
    note += f"<br>{knows}" if knows else ""
    return (
        "# dgemma · watch a Diffusion-Gemma sampler at work\n"
        "Many prompts denoise at once: every card is one request's canvas turning from random "
        "tokens into text. The sampler tiles its work so it fits in memory. "
        f"<small>{header_facts(api.model_info(facts, max_num_seqs), facts.get('memory_budget', 'none'))}{note}</small>"
    )


def backend_state(backend: Backend) -> LoadState:
    """A backend that loads its model after the page is served has a state; any other is ready."""
    state = getattr(backend, "state", None)
    return state() if state is not None else LoadState(True, False, "")


def _loading_tick(backend: Backend, shown_prompts: str, first_examples: str, replaying: bool = False,
                  shown: Sequence = (), built: Sequence = ()) -> list:
    """While loading: the status line. At ready: the model's header, defaults and example prompts,
    Run enabled, and the timer off (the status line says "Idle." unless a replay holds it).

    `shown` are the settings fields' values on the page and `built` the values the page was built
    with: a field the visitor has already changed keeps its value (every fresh page gets one tick,
    0.5 s after it opens, even when the model was ready long before)."""
    state = backend_state(backend)
    if not state.ready:  # still loading, or failed: only the status line changes
        return [gr.skip(), state.message, *[gr.skip()] * 13, gr.Timer(active=not state.failed)]
    facts = backend.info()  # once: it counts the weights and sizes the lesson's budget
    d, sets = backend.defaults, example_sets(api.model_info(facts, backend.max_num_seqs)["examples"])
    prompts = sets[0][0] if shown_prompts == first_examples else gr.skip()  # keep what the user typed
    p = d.params
    idle = gr.skip() if replaying else "Idle."
    settings = [d.max_new_tokens, p.max_denoising_steps, p.t_min, p.t_max, p.entropy_bound, p.confidence_threshold,
                p.stability_threshold, d.options.sampler, facts.get("lesson_budget", gr.skip())]
    if shown and built:
        settings = [value if now == then else gr.skip() for value, now, then in zip(settings, shown, built, strict=True)]
    return [_header(facts, backend.max_num_seqs), idle, gr.Button(interactive=True), *settings, prompts,
            gr.Dataset(samples=sets), gr.Timer(active=False)]


@dataclass
class Controls:
    """The Generate tab's inputs, in the order `generate_stream` takes them."""

    prompts: gr.Textbox
    concurrent: gr.Slider
    tiling: gr.Radio
    tile_size: gr.Number
    budget: gr.Textbox
    sampler: gr.Radio
    max_new_tokens: gr.Number
    max_steps: gr.Number
    t_min: gr.Number
    t_max: gr.Number
    entropy_bound: gr.Number
    confidence: gr.Number
    stability: gr.Number
    seed: gr.Number
    greedy: gr.Checkbox

    def inputs(self) -> list:
        return [getattr(self, f.name) for f in fields(self)]


def _settings_panel(backend: Backend, prompts: gr.Textbox, concurrent: gr.Slider) -> Controls:
    """The settings accordion, filled with the model's defaults."""
    defaults, limits, p = backend.defaults, backend.limits, backend.defaults.params
    with gr.Accordion("Settings (the model's defaults)", open=False):
        with gr.Row():
            max_new_tokens = gr.Number(defaults.max_new_tokens, label="max new tokens", precision=0,
                                       minimum=1, maximum=limits.max_new_tokens)
            max_steps = gr.Number(p.max_denoising_steps, label="denoising steps", precision=0)
            seed = gr.Number(p.seed, label="seed (request i gets seed + i)", precision=0)
            greedy = gr.Checkbox(p.greedy, label="greedy")
        with gr.Row():
            t_min = gr.Number(p.t_min, label="t_min")
            t_max = gr.Number(p.t_max, label="t_max")
            entropy_bound = gr.Number(p.entropy_bound, label="entropy bound")
            confidence = gr.Number(p.confidence_threshold, label="confidence threshold")
            stability = gr.Number(p.stability_threshold, label="stability threshold", precision=0)
        with gr.Row():
            tiling = gr.Radio(["auto", "off", "fixed"], value="auto", label="tiling",
                              info="auto: tiles sized from free memory; off: one tile; fixed: N requests per tile")
            tile_size = gr.Number(4, label="fixed tile size N", precision=0)
            sampler = gr.Radio(["reference", "chunked"], value=defaults.options.sampler, label="sampler step",
                               info="reference: eager, ~2 fp32 vocab copies per request (~1 on a CPU); chunked: streams the vocabulary")
            budget = gr.Textbox("", label="memory budget",
                                placeholder=f"the server's: {backend.info().get('memory_budget', 'none')}",
                                info="empty: the server's --memory-budget; e.g. 64MiB caps this run's sampler step")
    return Controls(prompts, concurrent, tiling, tile_size, budget, sampler, max_new_tokens, max_steps, t_min, t_max,
                    entropy_bound, confidence, stability, seed, greedy)


def build_demo(backend: Backend) -> gr.Blocks:
    """The whole app for one backend (one engine, one model)."""
    sessions = Sessions(backend.limits.max_queued)
    loading = backend_state(backend)
    facts = backend.info()
    examples = example_sets(api.model_info(facts, backend.max_num_seqs)["examples"])

    with gr.Blocks(title="dgemma: watch diffusion canvases denoise") as demo:
        header = gr.Markdown(_header(facts, backend.max_num_seqs))

        with gr.Tab("Generate"):
            with gr.Row():
                prompts = gr.Textbox(label="Prompts, one per line", lines=5, scale=3, value=examples[0][0])
                with gr.Column(scale=1, min_width=220):
                    concurrent = gr.Slider(1, backend.max_num_seqs, value=min(8, backend.max_num_seqs), step=1,
                                           label="Concurrent requests",
                                           info="Fills the batch by cycling the prompts (seed S + i each).")
                    run = gr.Button("Run", variant="primary", elem_id="run", interactive=loading.ready)
                    stop = gr.Button("Stop", variant="stop", elem_id="stop")
            example_list = gr.Examples(examples, inputs=[prompts], label="Example prompts")
            controls = _settings_panel(backend, prompts, concurrent)
            status = gr.Markdown("Idle." if loading.ready else loading.message, elem_id="status")
            player = playback.build()  # step slider, play / pause, download and load a run
            cards = gr.HTML(render_board(Board()), elem_id="cards")
            with gr.Row():
                with gr.Column():
                    entropy_plot = gr.Plot(plot(entropy_figure(Board())), label="confidence", elem_id="entropy-plot")
                    gr.Markdown(ENTROPY_TEXT, elem_classes="explain")
                with gr.Column():
                    tile_plot = gr.Plot(plot(board_tile_figure(Board())), label="tiles", elem_id="tile-plot")
                    gr.Markdown(TILE_TEXT, elem_classes="explain")

        with gr.Tab("Tiling vs OOM"):
            lesson_parts = lesson.build(backend)

        # ---------------------------------------------------------------- events
        embedded = bool(facts.get("embedded"))  # the teaching model: prompts outside its families get a note
        _wire_generate(backend, sessions, controls, run, stop, [cards, entropy_plot, tile_plot, status], player, embedded)
        playback.wire(player, [cards, entropy_plot, tile_plot], status)
        lesson.wire(backend, lesson_parts)
        api.register(backend, sessions, embedded)
        # Page first: until the model has loaded, a timer refreshes the status line; at ready it
        # enables Run, fills in the model's own defaults and example prompts, and stops.
        c = controls
        settings = [c.max_new_tokens, c.max_steps, c.t_min, c.t_max, c.entropy_bound, c.confidence, c.stability,
                    c.sampler, lesson_parts.budget]
        built = [field.value for field in settings]
        model_fields = [header, status, run, *settings, prompts, example_list.dataset]
        timer = gr.Timer(0.5, active=not loading.ready)
        timer.tick(lambda shown, played, *values: _loading_tick(backend, shown, examples[0][0], played.recording is not None,
                                                                values, built),
                   [prompts, player.state, *settings], [*model_fields, timer],
                   show_progress="hidden", api_visibility="private", concurrency_limit=None)

        def closed(request: gr.Request) -> None:
            # A closed tab (or a client gone for good): its requests stop and free their slots.
            client_left(sessions.cancel(request.session_hash or "anonymous"), "page closed")

        demo.unload(closed)
    return demo


def _wire_generate(backend: Backend, sessions: Sessions, controls: Controls, run: gr.Button, stop: gr.Button,
                   outputs: list, player: playback.Player, embedded: bool) -> None:
    """Run streams one call's cards, charts and status line, and records it for playback (the
    slider follows the run until the user takes it); Stop cancels the session's requests."""
    limits = backend.limits

    def generate_stream(text, n, mode, fixed, budget_, sampler_, new_tokens, steps, tmin, tmax, bound, threshold, stable,
                        seed_, greedy_, played: playback.Playback, request: gr.Request) -> Iterator[tuple]:
        values = (new_tokens, steps, tmin, tmax, bound, threshold, stable, seed_, greedy_)
        session = request.session_hash or "anonymous"
        try:  # a failure before the run starts: one sentence in the status line, the last run's cards stay
            batch = parse_prompts(prompts_from_text(text, n), limits)
            raw = dict(zip(SETTING_NAMES, values, strict=True))
            raw["tiling"] = _tiling(mode, fixed)
            raw["memory_budget"] = (budget_ or "").strip() or None
            raw["sampler"] = sampler_
            settings = parse_call_settings(raw, backend.defaults, limits, backend.max_num_seqs, len(batch))
            if sessions.pending(session) + len(batch) > limits.max_queued:
                raise ValueError(f"This session may have at most {limits.max_queued} requests waiting or running; "
                                 "wait or press Stop.")
            handle = backend.start(batch, settings)
        except ValueError as err:  # SettingsError is one
            yield gr.skip(), gr.skip(), gr.skip(), failed_status(str(err)), gr.skip(), gr.skip()
            return
        try:
            sessions.add(session, handle)
        except ValueError as err:  # another click of this session got in first
            handle.close()
            yield gr.skip(), gr.skip(), gr.skip(), failed_status(str(err)), gr.skip(), gr.skip()
            return
        if getattr(handle, "notice", ""):
            gr.Warning(handle.notice)
        handle.recording = played.start(run_header(backend.info(), settings, batch))
        started = time.monotonic()
        # Cards at every frame; each chart at most once a CHART_PERIOD_S, the two half a
        # period apart, and both at the end: a Plotly redraw costs the browser far more than
        # the cards do, and two at once would stall a busy laptop's page for a moment.
        due = [started, started + CHART_PERIOD_S / 2]
        board = Board(notes={i + 1: note for i, p in enumerate(batch) if (note := prompt_note(embedded, p))})
        shown = -1
        try:
            for board in frames(handle.poll, lambda b: b.finished and len(b.requests) >= handle.size, board):
                kept = playback.finished(played) if board.finished else gr.skip()
                if not played.follow:  # the user has the slider: the view is theirs
                    yield gr.skip(), gr.skip(), gr.skip(), gr.skip(), playback.live_slider(played), kept
                    continue
                if board.events == shown and not board.finished:  # nothing new: only the clock moves
                    yield gr.skip(), gr.skip(), gr.skip(), _status(board, started), gr.skip(), gr.skip()
                    continue
                shown = board.events
                now = time.monotonic()
                charts = []
                for i, figure in enumerate((entropy_figure, board_tile_figure)):
                    if now >= due[i] or board.finished:
                        due[i] = now + CHART_PERIOD_S
                        charts.append(plot(figure(board)))
                    else:
                        charts.append(gr.skip())
                yield render_board(board), *charts, _status(board, started), playback.live_slider(played), kept
        except Exception as err:  # noqa: BLE001 - e.g. ZeroGPU refused the call (quota, queue, duration)
            # One sentence where the user looks: the status line, and every card it stopped.
            if not isinstance(err, gr.Error):
                log.exception("a run's stream failed")
            sentence = err.message if isinstance(err, gr.Error) else f"The run failed: {first_line(err)}"
            if not board.requests:  # nothing had started: the last run's cards and charts stay as they were
                yield gr.skip(), gr.skip(), gr.skip(), failed_status(sentence), gr.skip(), gr.skip()
            else:
                fail_unfinished(board, sentence)
                yield render_board(board), plot(entropy_figure(board)), plot(board_tile_figure(board)), failed_status(sentence), gr.skip(), gr.skip()
        except GeneratorExit:  # Gradio closed the stream: its client has gone (tab closed, process died)
            client_left(handle.size - sum(v.status in FINAL for v in board.requests.values()), "stream closed")
            raise
        finally:
            played.live = False
            handle.close()  # a closed page: free the slots; a no-op for requests already done
            sessions.remove(session, handle)

    def stop_session(request: gr.Request) -> None:
        n = sessions.cancel(request.session_hash or "anonymous")
        log.info("stop: cancelled %d requests", n)
        if not n:
            gr.Info("Nothing to stop.")

    run.click(
        generate_stream, inputs=[*controls.inputs(), player.state], outputs=[*outputs, player.slider, player.download],
        api_name="generate_stream", api_visibility="undocumented",
        concurrency_limit=None,  # sessions share the engine; the engine does the batching
        show_progress="minimal",
    )
    # Stop cancels the engine requests, not the stream: the cards then show "cancelled" and
    # the stream ends by itself once the engine has freed every slot (within one step).
    stop.click(stop_session, None, None, api_visibility="private", concurrency_limit=None)
