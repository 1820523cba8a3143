"""Compare two settings side by side: the same prompts and seeds under the panel's settings with a
few changed per side (`name=value`, by the names of dgemma/settings.py's table). A runs, then B (one
after the other, so each side's tokens per second is its own), each streamed into its own live view
and recorded as any run; above them, both runs' figures, B's difference from A, and the texts that
came out differently, A's beside B's (two schedulers on the same prompts and seeds, say)."""

from __future__ import annotations

import html
from collections.abc import Iterator
from contextlib import closing
from dataclasses import dataclass
from typing import Any

import gradio as gr

from dgemma.examples import prompt_note
from dgemma.metrics import shown
from dgemma.serving.runs import RunService
from dgemma.settings import SETTINGS, name_value_pairs
from dgemma.ui import board_view
from dgemma.ui.board import Board
from dgemma.ui.charts import entropy_figure, plot
from dgemma.ui.compact import frame
from dgemma.ui.generate_tab import first_canvas, playback
from dgemma.ui.generate_tab.controls import read_panel

SIDES = ("A", "B")
# (figure, how it reads, format): the rows of the comparison table.
ROWS = (("decoder_forwards", "denoising steps (decoder forwards)", "d"),
        ("predictor_steps", "scheduler steps (forwards less corrector sweeps)", "d"),
        ("steps_per_canvas", "steps per canvas", ".2f"),
        ("tokens_per_s", "tokens/s", ".1f"), ("tokens_per_forward", "tokens per forward", ".2f"),
        ("peak_sampler_bytes", "peak sampler memory", "bytes"), ("sampler_share", "sampler share of a step", ".0%"))

DIFFERING_SHOWN = 8  # the texts that differ, listed under the table (32 would push the cards off a projector)
CHANGES_HELP = "name=value, one per line or comma-separated; the names: " + ", ".join(
    s.name for s in SETTINGS if s.group != "canvas")


@dataclass
class Compare:
    changes: tuple[gr.Textbox, gr.Textbox]  # A's and B's changed settings
    run: gr.Button
    table: gr.HTML
    cards: tuple[gr.HTML, gr.HTML]
    curves: tuple[gr.Plot, gr.Plot]
    downloads: tuple[gr.DownloadButton, gr.DownloadButton]
    state: gr.State  # one Playback per side


def build() -> Compare:
    gr.Markdown("**Two settings side by side**: the Generate tab's prompts and settings, run as A, then as B, with these changes.")
    with gr.Row():
        changes = tuple(gr.Textbox(label=f"{side}: settings changed from the panel", elem_id=f"compare-{side.lower()}",
                                   placeholder=example, info=CHANGES_HELP)
                        for side, example in zip(SIDES, ("scheduler=entropy_bound",
                                                         "scheduler=block_refinement")))  # fmt: skip
        run = gr.Button("Compare", variant="primary", elem_id="compare-run", scale=0, min_width=140)
    table = gr.HTML(elem_id="compare-table")
    with gr.Row():
        columns = []
        for side in SIDES:
            with gr.Column():
                columns.append((board_view.build(f"compare-cards-{side.lower()}", first_canvas.CARD_CLICKS_JS, "Compare"),
                                gr.Plot(plot(entropy_figure(Board())), label=f"confidence, {side}",
                                        elem_id=f"compare-entropy-{side.lower()}"),
                                gr.DownloadButton(f"Download run {side}", elem_id=f"compare-download-{side.lower()}",
                                                  interactive=False)))  # fmt: skip
    cards, curves, downloads = zip(*columns)
    return Compare(changes, run, table, cards, curves, downloads, gr.State(lambda: [playback.Playback(), playback.Playback()],
                                                                                    delete_callback=lambda sides: [s.evict("") for s in sides]))


def table(boards: list[Board], summaries: list[dict]) -> str:
    """Both runs' figures (their summaries, dgemma/metrics.py) and B's difference from A, plus how many
    texts are the same."""
    rows = []
    for key, label, spec in ROWS:
        a, b = (summary.get(key) for summary in summaries)
        if a is not None and b is not None:
            change = ("+" if b >= a else "−") + shown(abs(b - a), spec)
            ratio = f" ({b / a:.2f}×)" if a else ""
        else:
            change, ratio = "-", ""
        rows.append(f"<tr><th>{label}</th><td>{shown(a, spec)}</td><td>{shown(b, spec)}</td><td>{change}{ratio}</td></tr>")
    texts = [[v.committed_text for v in b.requests.values()] for b in boards]
    differ = [(i, x, y) for i, (x, y) in enumerate(zip(*texts)) if x != y]
    same = len(texts[0]) - len(differ)
    listed = "".join(f"<tr><th>{i + 1}</th><td>{html.escape(x)}</td><td>{html.escape(y)}</td></tr>"
                     for i, x, y in differ[:DIFFERING_SHOWN])
    more = f"<div>… and {len(differ) - DIFFERING_SHOWN} more</div>" if len(differ) > DIFFERING_SHOWN else ""
    differing = (f'<table class="compare-differ"><tr><th>request</th><th>A</th><th>B</th></tr>{listed}</table>{more}'
                 if differ else "")
    return ('<table class="compare-table"><tr><th></th><th>A</th><th>B</th><th>B − A</th></tr>' + "".join(rows)
            + f'</table><div class="compare-same">same text in {same} of {len(texts[0])} requests</div>' + differing)


def wire(service: RunService, compare: Compare, panel: dict[str, gr.components.Component], embedded: bool) -> None:
    """Compare runs A then B on the panel's prompts and settings (`panel`: the Generate tab's, by name)."""
    backend = service.backend

    def run(sides: list[playback.Playback], a_text: str, b_text: str, request: gr.Request,
            **values: Any) -> Iterator[dict]:
        try:  # each side: the panel's settings with its changes, through the one door
            batch, raw = read_panel(values)
            # `greedy=true, entropy_bound=0.5` (commas or lines) -> {"greedy": "true", "entropy_bound": "0.5"}
            changes = [name_value_pairs((text or "").replace("\n", ",").split(","),
                                        "Compare: write name=value (for example greedy=true), got {part!r}.")
                       for text in (a_text, b_text)]
            calls = [backend.request(batch, {**raw, **{k: v.strip() for k, v in c.items()}}) for c in changes]
        except ValueError as err:
            yield {compare.table: f'<div class="compare-error">⚠️ {html.escape(str(err))}</div>'}
            return
        boards = [Board(notes={i + 1: n for i, p in enumerate(batch) if (n := prompt_note(embedded, p))}) for _ in SIDES]
        summaries: list[dict] = [{}, {}]  # each side's, as its file's end line keeps it
        shown: dict = {compare.cards[0]: frame(boards[0]), compare.cards[1]: frame(boards[1])}
        for i, (side, call) in enumerate(zip(sides, calls)):
            ticks = service.stream(request, call, side, kept_as=f"compare-{SIDES[i].lower()}")
            with closing(board_view.frames(ticks, boards[i])) as frames:
                for tick, cards in frames:
                    if cards is not None:
                        shown[compare.cards[i]] = cards
                    if tick.failure:  # one sentence, on the side's cards and above them; B does not run
                        yield {compare.table: f'<div class="compare-error">⚠️ {SIDES[i]}: {html.escape(tick.failure)}</div>',
                               **shown}
                        return
                    if cards is None:  # the visitor has not drawn the last frame yet, or nothing changed
                        yield gr.skip()  # Gradio's one "nothing changes" for every output
                        continue
                    if tick.finished:  # the side's figures, as its file's end line keeps them
                        summaries[i] = tick.summary or {}
                        shown[compare.curves[i]] = plot(entropy_figure(boards[i]))
                        shown[compare.downloads[i]] = gr.DownloadButton(value=tick.file, interactive=tick.file is not None)
                    yield {compare.table: f"<div class='compare-status'>{SIDES[i]} running…</div>", **shown}
        yield {compare.table: table(boards, summaries), **shown}

    compare.run.click(run, inputs=[compare.state, *compare.changes], inputs_kwargs=panel,
                      outputs=[compare.table, *compare.cards, *compare.curves, *compare.downloads],
                      api_visibility="private", concurrency_limit=None, show_progress="minimal")
