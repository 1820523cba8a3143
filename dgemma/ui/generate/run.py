"""Run, Refine and Stop: a call's cards, charts and status line as its run streams through
`RunService.stream`, recorded for playback (the slider follows the run until the user takes it)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

import gradio as gr

from dgemma.examples import prompt_note
from dgemma.metrics import summary_line
from dgemma.serving.runs import RunService, tab_of
from dgemma.ui.board import Board, fail_unfinished, fold
from dgemma.ui.charts import board_tile_figure, entropy_figure, plot
from dgemma.ui.compact import frame
from dgemma.ui.generate import playback
from dgemma.ui.generate.controls import read_panel
from dgemma.ui.generate.first_canvas import refine_request

log = logging.getLogger(__name__)


def run_status(board: Board, started: float) -> str:
    """The line while a run streams: requests per status, sampler calls so far, seconds since Run."""
    counts: dict[str, int] = {}
    for view in board.requests.values():
        counts[view.status] = counts.get(view.status, 0) + 1
    parts = ", ".join(f"{n} {status}" for status, n in counts.items())
    return f"{parts} · {board.plan_count} sampler calls · {time.monotonic() - started:.1f} s"


def failed(sentence: str) -> tuple:
    """The outputs after a failure before any card: the one sentence on the status line, the rest as they were."""
    return gr.skip(), gr.skip(), gr.skip(), f"⚠️ {sentence}", gr.skip(), gr.skip()


def generate(service: RunService, embedded: bool) -> Callable[..., Iterator]:
    """Run's handler: the panel's prompts and settings (by name, Gradio's `inputs_kwargs`)."""
    def generate_stream(played: playback.Playback, request: gr.Request, **values: Any) -> Iterator:
        try:
            batch, raw = read_panel(service.backend.limits, values)
        except ValueError as err:
            yield failed(str(err))
            return
        yield from stream_run(service, embedded, batch, raw, played, request)

    return generate_stream


def refine(service: RunService, embedded: bool, side: int | None) -> Callable[..., Iterator]:
    """A card's Refine, in the tab's own view (`side` None) or a compare side's (0, 1): the card's prompt and
    seed, its first canvas starting from its text, the panel's other settings; streamed as a Run."""
    def refine_stream(played: playback.Playback, sides: list[playback.Playback], event: gr.EventData,
                      request: gr.Request, **values: Any) -> Iterator:
        source = played if side is None else sides[side]  # the run of the view the card is in
        try:
            prompt, seed, start = refine_request(getattr(event, "_data", None), source.recording, source.kept,
                                                 source.evicted)
            batch, raw = read_panel(service.backend.limits, {**values, "prompts": prompt, "concurrent": 1})
        except ValueError as err:
            yield failed(str(err))
            return
        yield from stream_run(service, embedded, batch, {**raw, "seed": seed, "start": start}, played, request)

    return refine_stream


def stop(service: RunService) -> Callable[[gr.Request], None]:
    """Stop cancels the tab's requests, not the stream: the cards then show "cancelled" and the stream
    ends by itself once the engine has freed every slot (within one step)."""
    def stop_runs(request: gr.Request) -> None:
        n = service.stop(tab_of(request))
        log.info("stop: cancelled %d requests", n)
        if not n:
            gr.Info("Nothing to stop.")

    return stop_runs


def stream_run(service: RunService, embedded: bool, batch: list[str], raw: dict, played: playback.Playback,
               request: gr.Request) -> Iterator[tuple]:
    """One call's cards, both charts, the status line, the slider and the download as it streams."""
    # Cards at every frame; each chart at most once a playback.CHART_PERIOD_S (one period, live and
    # replayed), the two half a period apart, and both at the end: a Plotly redraw costs the browser
    # far more than the cards do, and two at once would stall a busy laptop's page for a moment.
    due = [0.0, playback.CHART_PERIOD_S / 2]
    board = Board(notes={i + 1: note for i, p in enumerate(batch) if (note := prompt_note(embedded, p))})
    shown = -1
    ticks = service.stream(request, batch, raw, played)
    try:
        for tick in ticks:
            fold(tick.events, board)
            if tick.failure:  # one sentence where the user looks: the status line, and every card it stopped
                if not board.requests:  # nothing had started: the last run's cards and charts stay as they were
                    yield failed(tick.failure)
                else:
                    fail_unfinished(board, tick.failure)
                    yield (tick.stamp(frame(board)), plot(entropy_figure(board)), plot(board_tile_figure(board)),
                           f"⚠️ {tick.failure}", gr.skip(), gr.skip())
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
                    due[i] = now - tick.started + playback.CHART_PERIOD_S
                    charts.append(plot(figure(board)))
                else:
                    charts.append(gr.skip())
            line = run_status(board, tick.started)
            if tick.finished:  # and under it the run summary: the figures people quote
                line += f"\n\n**Run summary:** {summary_line(tick.summary)}"
            yield tick.stamp(frame(board)), *charts, line, playback.live_slider(played), kept
    finally:
        ticks.close()  # its end frees the run's requests (and ends a GPU call) now, not when collected
