"""Playback on the Generate tab: every run is recorded (dgemma/recording.py); a step slider with back /
play / pause / forward and a pace sets every card to its state at step k (the fold up to it, drawn as
the live view) and marks step k on both charts. The view follows a live run until the user takes
the slider. "Download run" saves it; "Load a run" replays a file with no model. Play is one stream from the
server, paced by its clock (`PlayClock`), not a browser timer asking for each step: a late tick would push
every later step back, while here a step shown late is followed by the one due by then, ending on time."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import gradio as gr

from dgemma.recording import Recording
from dgemma.serving.runs import RunService
from dgemma.ui.charts import board_tile_figure, entropy_figure, mark_step, plot
from dgemma.ui.compact import frame
from dgemma.ui.generate_tab import upload as loader
from dgemma.ui.seek import Seeker
from dgemma.ui.slider import Slider

PACE_S = (0.25, 2.0)  # seconds per step a viewer can choose
DEFAULT_PACE_S = 1.0
CHART_PERIOD_S = 1.0  # while playing, the charts redraw at most this often (and at the last step)
CHART_GAP_S = 0.05  # between a frame and each chart after it: the page draws each in a task of its own
# A step is sent this long before it is due: about what a real-scale frame (40 KB) takes to cross a
# 4 Mbit/s link with 40 ms latency and be drawn, so that it is on screen when due, not after.
SEND_AHEAD_S = 0.1


class PlayClock:
    """Play started at `step`, `pace` seconds a step; when it started, the step sent last, when the charts were drawn."""

    def __init__(self, step: int, pace: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.step, self.sent, self.pace, self.clock = step, step, pace, clock
        self.started = self.charts_at = clock()  # play shows the charts of the step it starts from

    def next_step(self, shown: int, pace: float) -> int:
        """The step a tick shows after `shown`: at least the next one, or the one due nearest to now
        (the frame takes a moment to reach the page: a step half a tick away is better shown now)."""
        now = self.clock()
        if pace != self.pace:  # the pace changed while playing: count from here at the new pace
            self.step, self.pace, self.started = shown, pace, now
        return max(shown + 1, self.step + int((now - self.started) / self.pace + 0.5))

    def wait(self, shown: int, ahead: float = SEND_AHEAD_S) -> float:
        """Seconds until the step after `shown` is to be sent: `ahead` of its due time, at most
        half a step early (0 when that time has come)."""
        ahead = min(ahead, self.pace / 2)
        return max(0.0, self.started + (shown + 1 - self.step) * self.pace - ahead - self.clock())

    def charts_due(self, period: float, last: bool) -> bool:
        """Whether this tick redraws the charts (and, if so, note that it did)."""
        now = self.clock()
        if last or now - self.charts_at >= period:
            self.charts_at = now
            return True
        return False


class Playback:
    """One browser tab's run as the page keeps it (the value of a gr.State: each tab has its own)."""

    def __init__(self) -> None:
        self.recording: Recording | None = None
        self.live = False  # the run is still streaming
        self.follow = True  # the view shows the latest step, until the user takes the slider
        self.playing = False  # the play stream advances the slider (until pause, the end, or the user's hand)
        self.kept = Seeker()  # the board last shown and keyframes: playing folds one step, a jump a few
        self.clock: PlayClock | None = None  # while playing: which step is due now
        self.last_used = time.monotonic()  # the last view: the memory cap evicts the least recent idle run
        self.evicted = ""  # why the run is gone (the memory cap), said at the next view

    def start(self, header: dict) -> Recording:
        return self.set_run(Recording(header), live=True)

    def set_run(self, recording: Recording, live: bool = False) -> Recording:
        """`recording` is the tab's run now (a live one, followed; or a loaded one); the last run's boards go."""
        self.recording, self.live, self.follow, self.playing = recording, live, live, False
        self.kept, self.evicted, self.last_used, self.clock = Seeker(), "", time.monotonic(), None
        return recording

    def stop_at(self, step: int, pause: bool = False) -> int:
        """Stop play and the following of a live run (the user has the controls); the step to show: `step`, or for
        a pause the step play sent last if later (its frame may be on its way as the page sends its slider's)."""
        clock, self.playing = self.clock, False  # stop, then read (play writes `sent` before it reads `playing`)
        self.follow, self.clock = False, None
        return max(step, clock.sent) if pause and clock is not None else step

    def held_bytes(self) -> int:
        """What this tab's run holds in memory: its recording, the board last shown and the keyframes."""
        recording = self.recording
        return (recording.held_bytes if recording is not None else 0) + self.kept.held_bytes()

    def evict(self, sentence: str) -> None:
        """Drop the run and its boards (the memory cap, or a closed tab); `sentence` says so at the next view."""
        self.recording, self.playing, self.kept, self.evicted = None, False, Seeker(), sentence


@dataclass
class Player:
    """The playback components (built under the charts of the Generate tab)."""

    state: gr.State
    slider: gr.Slider
    back: gr.Button
    play: gr.Button
    pause: gr.Button
    forward: gr.Button
    pace: gr.Slider
    download: gr.DownloadButton
    upload: gr.File  # Load a run


def build() -> Player:
    """The controls (call inside the Generate tab, under the charts)."""
    state = gr.State(Playback, delete_callback=lambda p: p.evict(""))
    with gr.Row(elem_id="playback"):
        slider = Slider(0, 1, value=0, step=1, label="step shown (after sampler call k)", scale=4, elem_id="step-slider",
                           info="0: every canvas's random start; the last: the final texts. Drag it to step through.")
        pace = Slider(*PACE_S, value=DEFAULT_PACE_S, step=0.25, label="seconds per step", scale=1, min_width=150,
                         elem_id="pace")
        with gr.Column(scale=2, min_width=380):
            with gr.Row():
                back = gr.Button("◀ back", elem_id="step-back", size="sm", min_width=60)
                play = gr.Button("▶ play", elem_id="play", size="sm", min_width=60)
                pause = gr.Button("❚❚ pause", elem_id="pause", size="sm", min_width=60)
                forward = gr.Button("forward ▶", elem_id="step-forward", size="sm", min_width=60)
            with gr.Row():
                download = gr.DownloadButton("Download run", value=None, interactive=False, elem_id="download-run",
                                             size="sm", min_width=120)
                upload = gr.File(label="Load a run (.jsonl)", file_types=[".jsonl"], file_count="single",
                                 elem_id="load-run", height=100, min_width=160)
            loader.note()  # how far an upload has come
    return Player(state, slider, back, play, pause, forward, pace, download, upload)


def view(recording: Recording, step: int, kept: Seeker | None = None, charts: bool = True) -> dict:
    """By name, the cards and (when `charts`) both charts at `step`: the fold of the events up to it (continued
    from `kept`'s board where it can be), the step marked on the charts."""
    with (kept or Seeker()).at(recording, step) as board:
        if not charts:
            return {"cards": frame(board)}
        last = recording.steps
        taken = max((v.steps for v in board.requests.values()), default=0)
        entropy = mark_step(entropy_figure(board), taken, (0, max(1, last)), f"step {step}", now=True)
        tiles = mark_step(board_tile_figure(board), step, (1, max(2, last)), f"call {step}")
        return {"cards": frame(board), "entropy": plot(entropy), "tiles": plot(tiles)}


def status(playback: Playback, recording: Recording, step: int, pace: float | None = None) -> str:
    """The status line during playback of `recording` (the tab's): which step, playing (at what pace)
    or paused, and which run."""
    what = "live run" if playback.live and recording.summary is None else "run"  # a summary: it has ended
    state = f"playing at {pace:g} s per step" if pace is not None else "paused"
    model = recording.header.get("model", {})
    name = "the embedded model" if model.get("embedded") else str(model.get("model") or "?").rstrip("/").rsplit("/", 1)[-1]
    return (f"Replay of the {what}: step {step} of {recording.steps} ({state}) · {len(recording.header['prompts'])} "
            f"requests on {name} · recorded {recording.header.get('created')}")


def live_slider(playback: Playback) -> gr.Slider:
    """During a run: the slider's range grows; its value follows the latest step unless the user took it."""
    recording = playback.recording  # once: the memory cap may evict it meanwhile
    if recording is None:
        return gr.skip()
    last = max(1, recording.steps)
    return gr.Slider(maximum=last, value=recording.steps) if playback.follow else gr.Slider(maximum=last)


def wire(service: RunService, player: Player, views: dict[str, gr.components.Component], status_line: gr.Markdown) -> None:
    """Slider, buttons, the paced play stream and upload; `views`: the component of each of `view`'s names."""
    p, cards = player, views["cards"]
    outputs = [*views.values(), status_line, p.slider]

    def show(playback: Playback, step: float, playing: bool = False, pace: float = DEFAULT_PACE_S, charts: bool = True) -> dict:
        recording = playback.recording  # once: the memory cap may evict it meanwhile
        if recording is None:
            raise gr.Error(playback.evicted or "Nothing to replay yet: press Run, or load a downloaded run.",
                           print_exception=False)
        playback.last_used = time.monotonic()
        step = max(0, min(int(step or 0), recording.steps))
        line = status(playback, recording, step, pace if playing else None)
        shown = {views[name]: value for name, value in view(recording, step, playback.kept, charts).items()}
        return {**shown, status_line: line, p.slider: gr.Slider(maximum=max(1, recording.steps), value=step)}

    def take(playback: Playback, step: float, pause: bool = False) -> dict:  # the user has the controls
        return show(playback, playback.stop_at(int(step or 0), pause))

    def play(playback: Playback, step: float, pace: float, request: gr.Request) -> Iterator[dict]:
        # Play is one stream, paced by the server's clock: no round trip per step, so a slow link
        # or a busy page delays each step by its transfer alone, never by a tick's request too.
        recording = playback.recording  # None: `show` says why
        again = recording is not None and int(step or 0) >= recording.steps  # at the end, play starts over
        step = 0 if again else int(step or 0)
        playback.follow, playback.playing, playback.clock = False, True, (clock := PlayClock(step, pace))
        first = show(playback, step, True, pace, charts=again)
        # The view already shows the step play starts from, unless it starts over: only the status line changes.
        yield first if again else {status_line: first[status_line], p.slider: first[p.slider]}

        def due_steps() -> Iterator[tuple[int, bool]]:  # (step, the last?) as each falls due, until play stops
            shown = step
            while True:
                time.sleep(clock.wait(shown))
                # Paused, taken by the user, played again, or a new Run that the view follows: stop here.
                recording = playback.recording  # once: the memory cap may evict it meanwhile (and stop play)
                if not playback.playing or playback.clock is not clock or (playback.live and playback.follow) or recording is None:
                    return
                shown = min(clock.next_step(shown, clock.pace), recording.steps)  # a late step catches up
                yield shown, shown >= recording.steps

        # A visitor still taking an earlier step skips the steps due meanwhile: they see the step due then.
        for (nxt, at_end), pace in service.paced(request, due_steps(), lambda due: due[1]):
            if pace is None:  # their page has not drawn the last frame yet: nothing goes
                yield gr.skip()  # Gradio's one "nothing changes" for every output
                continue
            if at_end:
                playback.playing = False
                playback.follow = playback.live  # caught up with a run still streaming: follow it again
            shown_now = show(playback, nxt, not at_end, clock.pace, charts=False)
            clock.sent = nxt  # before reading `playing`, which pause writes before reading this: one sees the other
            if not (playback.playing or at_end) or playback.clock is not clock:
                break  # paused while this step was drawn: the pause's view stays
            yield {**shown_now, cards: pace.stamp(shown_now[cards])}
            # The charts follow the frame, which they would hold up, a message each: short tasks on the page.
            if clock.charts_due(CHART_PERIOD_S, at_end) and (recording := playback.recording) is not None:
                charts = view(recording, nxt, playback.kept)
                for name in ("entropy", "tiles"):
                    time.sleep(CHART_GAP_S)
                    yield {views[name]: charts[name]}
            if at_end:
                return
        yield gr.skip()  # stopped: an ended stream's last values are sent again, and "playing…" must not come back

    def repace(playback: Playback, step: float, pace: float) -> None:
        if playback.clock is not None:  # counts on from the step shown, at the new pace
            playback.clock.next_step(int(step or 0), pace)

    def load_run(playback: Playback, file, request: gr.Request) -> dict:
        busy = "A run is streaming in this tab; wait for it or press Stop before loading another." if playback.live else ""
        recording = service.read_upload(request, file, busy)  # the upload removed, whatever it held; the last run's file too
        playback.set_run(recording)
        playback.kept.index(recording)  # every keyframe now: any jump on the slider folds a few steps at most
        service.hold(request, playback)
        return {**show(playback, 0), p.download: gr.DownloadButton(value=None, interactive=False)}

    quiet = dict(show_progress="hidden", api_visibility="private", concurrency_limit=None)
    playing = p.play.click(play, [p.state, p.slider, p.pace], outputs, **quiet)
    stops = dict(cancels=[playing], **quiet)  # a hand on the controls ends the play stream at once
    p.back.click(lambda playback, step: take(playback, (step or 0) - 1), [p.state, p.slider], outputs, **stops)
    p.forward.click(lambda playback, step: take(playback, (step or 0) + 1), [p.state, p.slider], outputs, **stops)
    p.pause.click(lambda playback, step: take(playback, step, pause=True), [p.state, p.slider], outputs, **stops)
    p.slider.input(take, [p.state, p.slider], outputs, trigger_mode="always_last", **stops)
    p.pace.release(repace, [p.state, p.slider, p.pace], None, **quiet)
    # Whatever the load made of it, the upload area is emptied for the next file.
    p.upload.upload(load_run, [p.state, p.upload], [*outputs, p.download], **quiet).then(
        lambda: None, None, p.upload, **quiet)

