"""Where a click becomes engine work: Run submits one call's prompts through the Backend and streams
its cards, charts and status line (recording it for playback); Stop cancels the session's requests."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator

import gradio as gr

from dgemma.errors import first_line
from dgemma.examples import prompt_note
from dgemma.recording import run_header
from dgemma.serving.backend import Backend
from dgemma.serving.inputs import parse_call_settings, parse_prompts, prompts_from_text
from dgemma.serving.sessions import Sessions, client_left
from dgemma.ui.board import FINAL, Board, fail_unfinished
from dgemma.ui.compact import frame
from dgemma.ui.charts import board_tile_figure, entropy_figure, plot
from dgemma.ui.generate import playback
from dgemma.ui.generate.controls import Controls, raw_settings
from dgemma.ui.generate.status import failed_status, run_status
from dgemma.ui.stream import frames

log = logging.getLogger(__name__)

# Seconds between redraws of one chart while a run streams (cards redraw every frame).
CHART_PERIOD_S = float(os.environ.get("DGEMMA_CHART_PERIOD_S", "1.0"))


def wire_run(backend: Backend, sessions: Sessions, controls: Controls, run: gr.Button, stop: gr.Button,
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
            raw = raw_settings(values, mode, fixed, budget_, sampler_)
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
        facts = backend.info()
        handle.recording = played.start(run_header(facts, settings, batch))
        length = int(facts.get("canvas_length") or 0)  # a finished board no longer shows its canvas length
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
                    yield gr.skip(), gr.skip(), gr.skip(), run_status(board, started), gr.skip(), gr.skip()
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
                yield frame(board, length), *charts, run_status(board, started), playback.live_slider(played), kept
        except Exception as err:  # noqa: BLE001 - e.g. ZeroGPU refused the call (quota, queue, duration)
            # One sentence where the user looks: the status line, and every card it stopped.
            if not isinstance(err, gr.Error):
                log.exception("a run's stream failed")
            sentence = err.message if isinstance(err, gr.Error) else f"The run failed: {first_line(err)}"
            if not board.requests:  # nothing had started: the last run's cards and charts stay as they were
                yield gr.skip(), gr.skip(), gr.skip(), failed_status(sentence), gr.skip(), gr.skip()
            else:
                fail_unfinished(board, sentence)
                yield frame(board, length), plot(entropy_figure(board)), plot(board_tile_figure(board)), failed_status(sentence), gr.skip(), gr.skip()
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
