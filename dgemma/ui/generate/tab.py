"""The Generate tab, top to bottom: prompts and Run / Stop, example prompts, settings, the status
line, playback, the board (overview, focus card, cards) with the two charts beside it; then the
events that wire them."""

from __future__ import annotations

from dataclasses import dataclass

import gradio as gr

from dgemma.serving.backend import Backend
from dgemma.serving.runs import RunService
from dgemma.ui import board_view
from dgemma.ui.board import Board
from dgemma.ui.charts import board_tile_figure, entropy_figure, plot
from dgemma.ui.generate import compare, first_canvas, playback, run
from dgemma.ui.generate.controls import FIELDS, Panel, settings_panel

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


@dataclass
class GenerateTab:
    """The tab's components that its events (and the page's loading tick) refer to."""

    panel: Panel
    compare: compare.Compare
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
            concurrent = gr.Slider(1, backend.max_num_seqs, value=min(8, backend.max_num_seqs), step=1,
                                   label="Concurrent requests", elem_id="concurrent",
                                   info="Fills the batch by cycling the prompts (seed S + i each).")
            run = gr.Button("Run", variant="primary", elem_id="run", interactive=ready)
            stop = gr.Button("Stop", variant="stop", elem_id="stop")
    example_list = gr.Examples(examples, inputs=[prompts], label="Example prompts")
    canvas = first_canvas.build()
    settings = settings_panel(backend)
    found = {"prompts": prompts, "concurrent": concurrent, **settings, **canvas}
    panel = Panel({name: found[name] for name in FIELDS})
    status = gr.Markdown("Idle." if ready else loading_message, elem_id="status")
    player = playback.build()  # step slider, play / pause, download and load a run
    # On a projector (1366 x 768) the overview and both charts are on screen at once: the charts
    # beside the board, level with its overview; the cards below the overview.
    with gr.Row(equal_height=False, elem_id="live-views"):
        with gr.Column(scale=3, min_width=560):
            cards = board_view.build(clicks_js=first_canvas.CARD_CLICKS_JS)  # overview, focus card, cards: drawn by the browser
        with gr.Column(scale=2, min_width=380):
            entropy_plot = gr.Plot(plot(entropy_figure(Board())), label="confidence", elem_id="entropy-plot")
            tile_plot = gr.Plot(plot(board_tile_figure(Board())), label="tiles", elem_id="tile-plot")
    with gr.Row():  # how to read the charts, under them: the column beside the board holds only what is live
        gr.Markdown(ENTROPY_TEXT, elem_classes="explain")
        gr.Markdown(TILE_TEXT, elem_classes="explain")
    side_by_side = compare.build()
    return GenerateTab(panel, side_by_side, run, stop, example_list, status, player, cards, entropy_plot, tile_plot)


def wire(service: RunService, tab: GenerateTab, embedded: bool) -> None:
    """Run, each view's Refine and Stop; playback of the last (or a loaded) run in the same views; Compare.
    The handlers take the panel by name."""
    views = [tab.cards, tab.entropy_plot, tab.tile_plot]
    streamed = dict(outputs=[*views, tab.status, tab.player.slider, tab.player.download], inputs_kwargs=tab.panel.fields,
                    concurrency_limit=None, show_progress="minimal")  # tabs share the engine; the engine batches
    tab.run.click(run.generate(service, embedded), inputs=[tab.player.state], api_name="generate_stream",
                  api_visibility="undocumented", **streamed)
    for side, cards in [(None, tab.cards), *enumerate(tab.compare.cards)]:
        cards.refine(run.refine(service, embedded, side), inputs=[tab.player.state, tab.compare.state],
                     api_visibility="private", **streamed)
    tab.stop.click(run.stop(service), None, None, api_visibility="private", concurrency_limit=None)
    playback.wire(service, tab.player, views, tab.status)
    compare.wire(service, tab.compare, tab.panel, embedded)
