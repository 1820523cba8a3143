"""Where a click becomes engine work: Run submits one call's prompts through the Backend and streams
its cards, charts and status line (recording it for playback); a finished card's Refine runs its
prompt and seed again from its text; Stop cancels the tab's requests."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import gradio as gr

from dgemma.examples import prompt_note
from dgemma.serving.runs import RunService, tab_of
from dgemma.ui.board import Board, fail_unfinished, fold
from dgemma.ui.charts import board_tile_figure, entropy_figure, plot
from dgemma.ui.compact import frame
from dgemma.ui.generate import playback
from dgemma.ui.generate.controls import Panel, read_panel
from dgemma.ui.generate.first_canvas import COMPARE_SIDES, finished_card, refine_request
from dgemma.ui.generate.status import failed_status, finished_status, run_status

log = logging.getLogger(__name__)

# Seconds between redraws of one chart while a run streams (cards redraw every frame).
CHART_PERIOD_S = float(os.environ.get("DGEMMA_CHART_PERIOD_S", "1.0"))


@dataclass
class RunViews:
    """What Run, Refine and Stop read and write: the panel, the buttons, the views a frame updates
    (the cards, both charts, the status line), the tab's playback, and each view whose cards' Refine
    runs a card again (None: the tab's own cards; "a", "b": a compare side's, its run in `sides`)."""

    panel: Panel
    run: gr.Button
    stop: gr.Button
    views: list
    player: playback.Player
    refine_from: dict[str | None, gr.HTML]
    sides: gr.State  # Compare's Playbacks, one a side


def wire_run(service: RunService, tab: RunViews, embedded: bool) -> None:
    """Run streams one call's cards, charts and status line, and records it for playback (the
    slider follows the run until the user takes it); a card's Refine runs its prompt and seed again
    from its text; Stop cancels the tab's requests. The handlers take the panel by name."""
    limits = service.backend.limits
    status = tab.views[-1]

    def stream(batch: list[str], raw: dict, played: playback.Playback, request: gr.Request) -> Iterator:
        return stream_run(service, embedded, batch, raw, played, request)

    def generate_stream(played: playback.Playback, request: gr.Request, **values: Any) -> Iterator:
        try:
            batch, raw = read_panel(limits, values)
        except ValueError as err:
            yield {status: failed_status(str(err))}
            return
        yield from stream(batch, raw, played, request)

    def refine_of(run: str | None) -> Callable[..., Iterator]:
        def refine_stream(played: playback.Playback, sides: list[playback.Playback], event: gr.EventData,
                          request: gr.Request, **values: Any) -> Iterator:
            def held(row: int, side: str | None) -> tuple[str, int, str]:  # the card's run: this tab's or a side's
                source = played if side is None else sides[COMPARE_SIDES.index(side)]
                return finished_card(source.recording, source.kept, row, source.evicted)

            try:  # the card's prompt and seed, its text the first canvas's start; the panel's other settings
                prompt, seed, start = refine_request(getattr(event, "_data", None), run, held)
                batch, raw = read_panel(limits, {**values, "prompts": prompt, "concurrent": 1})  # the card's prompt alone
                raw = {**raw, "seed": seed, "start": start}
            except ValueError as err:
                yield {status: failed_status(str(err))}
                return
            yield from stream(batch, raw, played, request)

        return refine_stream

    def stop_runs(request: gr.Request) -> None:
        n = service.stop(tab_of(request))
        log.info("stop: cancelled %d requests", n)
        if not n:
            gr.Info("Nothing to stop.")

    outputs = [*tab.views, tab.player.slider, tab.player.download]
    streamed = dict(outputs=outputs, concurrency_limit=None,  # tabs share the engine; the engine batches
                    show_progress="minimal")
    tab.run.click(generate_stream, inputs=[tab.player.state], inputs_kwargs=tab.panel.fields,
                  api_name="generate_stream", api_visibility="undocumented", **streamed)
    for run, cards in tab.refine_from.items():
        cards.refine(refine_of(run), inputs=[tab.player.state, tab.sides], inputs_kwargs=tab.panel.fields,
                     api_visibility="private", **streamed)
    # Stop cancels the engine requests, not the stream: the cards then show "cancelled" and
    # the stream ends by itself once the engine has freed every slot (within one step).
    tab.stop.click(stop_runs, None, None, api_visibility="private", concurrency_limit=None)


def stream_run(service: RunService, embedded: bool, batch: list[str], raw: dict, played: playback.Playback,
               request: gr.Request) -> Iterator[tuple]:
    """One call's cards, charts and status line as it streams, recorded for playback: the outputs
    of Run (and of Refine)."""
    length = int(service.backend.info().get("canvas_length") or 0)  # a finished board no longer shows its canvas length
    # Cards at every frame; each chart at most once a CHART_PERIOD_S, the two half a
    # period apart, and both at the end: a Plotly redraw costs the browser far more than
    # the cards do, and two at once would stall a busy laptop's page for a moment.
    due = [0.0, CHART_PERIOD_S / 2]
    board = Board(notes={i + 1: note for i, p in enumerate(batch) if (note := prompt_note(embedded, p))})
    shown = -1
    ticks = service.stream(request, batch, raw, played)
    try:
        for tick in ticks:
            fold(tick.events, board)
            if tick.failure:  # one sentence where the user looks: the status line, and every card it stopped
                line = failed_status(tick.failure)
                if not board.requests:  # nothing had started: the last run's cards and charts stay as they were
                    yield gr.skip(), gr.skip(), gr.skip(), line, gr.skip(), gr.skip()
                else:
                    fail_unfinished(board, tick.failure)
                    yield (tick.stamp(frame(board, length)), plot(entropy_figure(board)), plot(board_tile_figure(board)),
                           line, gr.skip(), gr.skip())
                return
            kept = gr.DownloadButton(value=tick.file, interactive=tick.file is not None) if tick.finished else gr.skip()
            if not played.follow:  # the user has the slider: the view is theirs
                yield gr.skip(), gr.skip(), gr.skip(), gr.skip(), playback.live_slider(played), kept
                continue
            if not tick.send:  # the visitor has not drawn the last frame yet: nothing goes
                yield gr.skip(), gr.skip(), gr.skip(), gr.skip(), gr.skip(), gr.skip()
                continue
            if board.events == shown and not tick.finished:  # nothing new: only the clock moves
                yield gr.skip(), gr.skip(), gr.skip(), run_status(board, tick.started), gr.skip(), gr.skip()
                continue
            shown = board.events
            now = time.monotonic()
            charts = []
            for i, figure in enumerate((entropy_figure, board_tile_figure)):
                if now >= tick.started + due[i] or tick.finished:
                    due[i] = now - tick.started + CHART_PERIOD_S
                    charts.append(plot(figure(board)))
                else:
                    charts.append(gr.skip())
            line = finished_status(board, tick.started, tick.summary) if tick.finished else run_status(board, tick.started)
            yield tick.stamp(frame(board, length)), *charts, line, playback.live_slider(played), kept
    finally:
        ticks.close()  # its end frees the run's requests (and ends a GPU call) now, not when collected
