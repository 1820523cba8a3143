"""The Generate tab, top to bottom: prompts and Run / Stop, example prompts, settings, the status
line, playback, the board (overview, focus card, cards) with the two charts beside it; then the
events that wire them, and the handlers of Run, Refine and Stop: a call's cards, charts and status
line as its run streams through `RunService.stream`, recorded for playback (the slider follows the
run until the user takes it)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import closing
from dataclasses import dataclass
from typing import Any

import gradio as gr

from dgemma.examples import prompt_note
from dgemma.metrics import summary_line
from dgemma.serving.backend import Backend
from dgemma.serving.runs import RunService, tab_of
from dgemma.settings import RunRequest
from dgemma.ui import board_view
from dgemma.ui.board import Board
from dgemma.ui.charts import board_tile_figure, entropy_figure, plot
from dgemma.ui.generate_tab import compare, first_canvas, playback
from dgemma.ui.generate_tab.controls import FIELDS, read_panel, settings_panel
from dgemma.ui.generate_tab.first_canvas import refine_request
from dgemma.ui.slider import Slider

log = logging.getLogger(__name__)

ENTROPY_TEXT = (
    "**Confidence per step.** Each line is one request's mean token entropy after each denoising "
    "step. A canvas starts as random tokens (high entropy) and converges when its mean drops below "
    "the dashed threshold and its draft stops changing; then it is committed and the next canvas starts."
)
TILE_TEXT = (
    "**Tiles against free memory.** Each sampler call sees how much memory is free and groups the "
    "denoising requests into tiles that fit half of it. Grey area: requests denoising; blue: the "
    "largest tile; dotted orange: tiles per call; right axis: free memory, the peak transient, the budget; under a "
    "budget, each call's memory ledger stacked up to it: weights, samplers' state, KV caches, the peak, what was free."
)


@dataclass
class GenerateTab:
    """The tab's components that its events (and the page's loading tick) refer to."""

    panel: dict[str, gr.components.Component]  # each name of controls.FIELDS: its input
    run: gr.Button
    stop: gr.Button
    examples: gr.Examples
    status: gr.Markdown
    player: playback.Player
    cards: gr.HTML
    entropy_plot: gr.Plot
    tile_plot: gr.Plot


def build(backend: Backend, examples: list[list[str]], ready: bool, loading_message: str) -> GenerateTab:
    """The tab's components (call inside `gr.Tab`)."""
    with gr.Row():
        prompts = gr.Textbox(label="Prompts, one per line", lines=5, scale=3, value=examples[0][0], elem_id="prompts")
        with gr.Column(scale=1, min_width=220):
            concurrent = Slider(1, backend.max_num_seqs, value=min(8, backend.max_num_seqs), step=1,
                                   label="Concurrent requests", elem_id="concurrent",
                                   info="Fills the batch by cycling the prompts (seed S + i each).")
            with gr.Row():  # side by side: the board starts on the first screen of a projector (1366 x 768)
                run = gr.Button("Run", variant="primary", elem_id="run", interactive=ready, min_width=80)
                stop = gr.Button("Stop", variant="stop", elem_id="stop", min_width=80)
    example_list = gr.Examples(examples, inputs=[prompts], label="Example prompts")
    with gr.Row(equal_height=False):  # closed, side by side: one click away, one line high
        canvas, settings = first_canvas.build(), settings_panel(backend)
    found = {"prompts": prompts, "concurrent": concurrent, **settings, **canvas}
    panel = {name: found[name] for name in FIELDS}
    status = gr.Markdown("Idle." if ready else loading_message, elem_id="status")
    # On a projector (1366 x 768) the overview and both charts are on screen at once: the charts
    # beside the board, level with its overview; the cards below the overview.
    with gr.Row(equal_height=False, elem_id="live-views"):
        with gr.Column(scale=3, min_width=560):
            cards = board_view.build(clicks_js=first_canvas.CARD_CLICKS_JS)  # overview, focus card, cards: drawn by the browser
        with gr.Column(scale=2, min_width=380):
            entropy_plot = gr.Plot(plot(entropy_figure(Board())), label="confidence", elem_id="entropy-plot")
            tile_plot = gr.Plot(plot(board_tile_figure(Board())), label="tiles", elem_id="tile-plot")
    player = playback.build()  # step slider, play / pause, download and load a run: under the views it moves
    with gr.Row():  # how to read the charts, under them: the column beside the board holds only what is live
        gr.Markdown(ENTROPY_TEXT, elem_classes="explain")
        gr.Markdown(TILE_TEXT, elem_classes="explain")
    return GenerateTab(panel, run, stop, example_list, status, player, cards, entropy_plot, tile_plot)


def wire(service: RunService, tab: GenerateTab, side_by_side: compare.Compare, embedded: bool) -> None:
    """Run, each view's Refine (`side_by_side`'s too: the Compare tab's) and Stop; playback of the last (or a
    loaded) run in the same views; Compare. The handlers take the panel by name."""
    views = {"cards": tab.cards, "entropy": tab.entropy_plot, "tiles": tab.tile_plot}  # by playback.view's names
    streamed = dict(outputs=[*views.values(), tab.status, tab.player.slider, tab.player.download], inputs_kwargs=tab.panel,
                    concurrency_limit=None, show_progress="minimal")  # tabs share the engine; the engine batches

    def run_stream(played: playback.Playback, request: gr.Request, **values: Any) -> Iterator:
        """Run: the panel's prompts and settings (by name, Gradio's `inputs_kwargs`)."""
        yield from stream_run(service, embedded, lambda: service.backend.request(*read_panel(values)), played, request, tab)

    def stop_runs(request: gr.Request) -> None:
        """Stop cancels the tab's requests, not the stream: the cards then show "cancelled" and the stream
        ends by itself once the engine has freed every slot (within one step)."""
        n = service.stop(tab_of(request))
        log.info("stop: cancelled %d requests", n)
        if not n:
            gr.Info("Nothing to stop.")

    tab.run.click(run_stream, inputs=[tab.player.state], api_name="generate_stream", api_visibility="undocumented",
                  **streamed)
    for side, cards in [(None, tab.cards), *enumerate(side_by_side.cards)]:
        cards.refine(refine_handler(service, embedded, tab, side), inputs=[tab.player.state, side_by_side.state],
                     api_visibility="private", **streamed)
    tab.stop.click(stop_runs, None, None, api_visibility="private", concurrency_limit=None)
    playback.wire(service, tab.player, views, tab.status)
    compare.wire(service, side_by_side, tab.panel, embedded)


def run_status(board: Board, started: float) -> str:
    """The line while a run streams: requests per status, sampler calls so far, seconds since Run."""
    counts: dict[str, int] = {}
    for view in board.requests.values():
        counts[view.status] = counts.get(view.status, 0) + 1
    parts = ", ".join(f"{n} {status}" for status, n in counts.items())
    return f"{parts} · {board.plan_count} sampler calls · {time.monotonic() - started:.1f} s"


def failed(tab: GenerateTab, sentence: str) -> dict:
    """The outputs after a failure before any card: the one sentence on the status line, the rest as they were."""
    return {tab.status: f"⚠️ {sentence}"}


def refine_handler(service: RunService, embedded: bool, tab: GenerateTab, side: int | None) -> Callable[..., Iterator]:
    """A card's Refine, in the tab's own view (`side` None) or a compare side's (0, 1): the card's prompt and
    seed, its first canvas starting from its text, the panel's other settings; streamed as a Run."""
    def refine_stream(played: playback.Playback, sides: list[playback.Playback], event: gr.EventData,
                      request: gr.Request, **values: Any) -> Iterator:
        source = played if side is None else sides[side]  # the run of the view the card is in

        def call() -> RunRequest:
            prompt, changes = refine_request(getattr(event, "_data", None), source.recording, source.kept, source.evicted)
            batch, raw = read_panel({**values, "prompts": prompt, "concurrent": 1})
            return service.backend.request(batch, {**raw, **changes})

        yield from stream_run(service, embedded, call, played, request, tab)

    return refine_stream


def stream_run(service: RunService, embedded: bool, make_call: Callable[[], RunRequest], played: playback.Playback,
               request: gr.Request, tab: GenerateTab) -> Iterator[dict]:
    """One call (`make_call()`: ValueError, one sentence on the status line) as it streams: its cards, both charts,
    the status line, the slider and the download (by component)."""
    try:
        call = make_call()
    except ValueError as err:
        yield failed(tab, str(err))
        return
    # Cards at every frame; each chart at most once a playback.CHART_PERIOD_S (one period, live and
    # replayed), the two half a period apart, and both at the end: a Plotly redraw costs the browser
    # far more than the cards do, and two at once would stall a busy laptop's page for a moment.
    due = [0.0, playback.CHART_PERIOD_S / 2]
    board = Board(notes={i + 1: note for i, p in enumerate(call.prompts) if (note := prompt_note(embedded, p))})
    ticks = service.stream(request, call, played)
    # While the user has the slider the view is theirs: no frame is made for it.
    with closing(board_view.frames(ticks, board, draw=lambda board: played.follow)) as shown:
        for tick, cards in shown:
            if tick.failure:  # one sentence where the user looks: the status line, and every card it stopped
                # Nothing had started: the last run's cards and charts stay as they were.
                yield failed(tab, tick.failure) if cards is None else {**failed(tab, tick.failure), tab.cards: cards,
                    tab.entropy_plot: plot(entropy_figure(board)), tab.tile_plot: plot(board_tile_figure(board))}
                return
            update: dict = {tab.player.download: gr.DownloadButton(value=tick.file, interactive=bool(tick.file))} if tick.finished else {}
            if cards is None:  # the user has the slider (it still grows), the last frame is not drawn yet, or only the clock moves
                if tick.send and played.follow:
                    update[tab.status] = run_status(board, tick.started)
                if not played.follow:
                    update[tab.player.slider] = playback.live_slider(played)
                yield update or gr.skip()  # an empty dict is not Gradio's "nothing changes"; skip() is
                continue
            now = time.monotonic()
            for i, (figure, chart) in enumerate(((entropy_figure, tab.entropy_plot), (board_tile_figure, tab.tile_plot))):
                if now >= tick.started + due[i] or tick.finished:
                    due[i] = now - tick.started + playback.CHART_PERIOD_S
                    update[chart] = plot(figure(board))
            line = run_status(board, tick.started)
            if tick.finished:  # and under it the run summary: the figures people quote
                line += f"\n\n**Run summary:** {summary_line(tick.summary)}"
            yield {**update, tab.cards: cards, tab.status: line, tab.player.slider: playback.live_slider(played)}
