"""A run's whole life, in one place: the tab's cap, the start, its owner, its recording and file, its
pacing, its close (docs/architecture.md, "Serving"). A *tab* is one browser tab (Gradio's session
hash; an API client's is its own); a *keep key* is where a tab's kept run is held, on disk and under the
memory cap (`keep_key`); the engine's subscriptions are the backend's own, never these."""

from __future__ import annotations

import atexit
import logging
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from typing import Any, Protocol, TypeVar

import gradio as gr

from dgemma.errors import first_line
from dgemma.events import Event, TilePlan
from dgemma.metrics import run_summary
from dgemma.recording import Recording, RecordingError, load_file, recording_bound, run_header
from dgemma.serving import held_runs, runfiles
from dgemma.serving.acks import Pace, paces_by_acks
from dgemma.serving.backend import Backend, Output, Progress, Run, read_run
from dgemma.serving.held_runs import HeldRuns, Holder
from dgemma.serving.runfiles import RunFiles
from dgemma.settings import RunRequest

log = logging.getLogger(__name__)
T = TypeVar("T")

HZ = 6.0  # frames a second at most: the plain rate, and the page's when it draws them in time
KEEPALIVE_S = 0.5  # a tick at least this often, drawn or not: a yield is where Gradio ends a gone client's stream
NO_ROOM = ("The server's memory for recorded runs is full right now; try again in a minute, or call without "
           "'record'.")


def keep_key(tab: str, kept_as: str = "") -> str:
    """Where a tab's run is kept: under the tab itself (its last run), or `kept_as` (a side of its comparison)."""
    return f"{tab}#{kept_as}" if kept_as else tab


def tab_of(request: object) -> str:
    """The tab a gr.Request came from (Gradio's session hash)."""
    return getattr(request, "session_hash", None) or "anonymous"


@dataclass(frozen=True)
class Keeping:
    """The app's two caps: run files on disk, runs held in memory."""

    files: RunFiles
    held: HeldRuns

    @classmethod
    def default(cls) -> Keeping:
        """For a page built outside app.py (as tests build one): a directory of its own, removed at exit, the default caps."""
        files = RunFiles(tempfile.mkdtemp(prefix="dgemma-page-files-"), runfiles.DEFAULT_MAX_BYTES, runfiles.DEFAULT_MAX_AGE_S)
        atexit.register(files.close)
        return cls(files, HeldRuns(held_runs.DEFAULT_MAX_BYTES))


class Keeper(Holder, Protocol):
    """What keeps a tab's run for replay (the page's Playback): it starts each run's recording."""

    def start(self, header: dict) -> Recording: ...


@dataclass(frozen=True)
class Tick:
    """What a view does next: fold `events` (those since the last tick) into its board, and draw it if
    `send`: the visitor can take a frame now (send it through `stamp`)."""

    events: list[Event]
    send: bool = False
    pace: Pace | None = None  # the stream's, where its frames are paced
    failure: str = ""  # the run failed (or never started): one sentence, the stream's last tick
    finished: bool = False  # every request ended: the last tick
    summary: dict | None = None  # the run's figures (dgemma/metrics.py), on the finished tick
    file: str | None = None  # the run's file (Download run), on the finished tick of a kept run
    started: float = 0.0  # time.monotonic() at the start

    def stamp(self, frame: dict) -> dict:
        """The frame sent now, marked so that the page can say it drew it."""
        return self.pace.stamp(frame) if self.pace is not None else frame


@dataclass
class Results:
    """A run waited for to its end (the API's)."""

    outputs: list[Output]
    plans: list[TilePlan]
    summary: dict  # the run's figures (dgemma/metrics.py)
    recording: str | None  # the run file's text, when asked for
    pid: int | None  # the process that ran the model (ZeroGPU: a worker)


@dataclass(eq=False)  # each run is itself: two of one size are two
class _Owned:
    """One run of a tab, counted against its cap from before it starts."""

    size: int
    run: Run | None = None

    def cancel(self) -> None:
        if self.run is not None:
            self.run.cancel()


def ticks(poll: Callable[[float], list[Event]], over: Callable[[], bool], pace: Pace | None = None, hz: float = HZ,
          keepalive: float = KEEPALIVE_S, clock: Callable[[], float] = time.monotonic) -> Iterator[Tick]:
    """A stream's ticks: `poll(timeout)`'s events as they come, a tick at most `hz` times a second when
    there is something new and the visitor can take a frame, at least every `keepalive` seconds (a tick
    that may not be drawn carries the events to fold all the same), and the last when `over()`; `pace`:
    whether the visitor can take a frame (None: always)."""
    pending: list[Event] = []
    fresh = False  # events arrived since the last tick a frame could go on
    period = 1.0 / hz
    next_tick = last = clock()
    while True:
        events = poll(max(0.0, next_tick - clock()))
        pending += events
        fresh = fresh or bool(events)
        if over():
            yield Tick(pending, True, pace, finished=True)  # the last frame always goes
            return
        now = clock()
        if now >= next_tick:
            ready = fresh and (pace is None or pace.ready())
            if ready or now - last >= keepalive:
                yield Tick(pending, ready or not fresh, pace)
                pending, last = [], now
                fresh = fresh and not ready
            # If drawing ran late, wait half a period anyway: the engine needs the CPU more.
            next_tick = max(next_tick + period, clock() + period / 2)


class RunService:
    """The runs of one backend: every tab's, from its cap to its close."""

    def __init__(self, backend: Backend, keeping: Keeping | None = None) -> None:
        self.backend = backend
        self.keeping = keeping or Keeping.default()
        self._runs: dict[str, list[_Owned]] = {}  # tab -> its runs waiting or running
        self._keys: dict[str, set[str]] = {}  # tab -> the keys its runs are kept under
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ a tab's runs

    def _own(self, tab: str, size: int) -> _Owned:
        """Count `size` more requests against the tab's cap, or raise ValueError (the one sentence)."""
        limit = self.backend.limits.max_queued
        with self._lock:
            runs = self._runs.setdefault(tab, [])
            held = sum(r.size for r in runs)
            if held + size > limit:
                if not runs:
                    del self._runs[tab]
                raise ValueError(f"This tab already has {held} requests waiting or running and {size} more would "
                                 f"pass its limit of {limit}; wait for them or press Stop.")
            owned = _Owned(size)
            runs.append(owned)
            return owned

    def _disown(self, tab: str, owned: _Owned) -> None:
        with self._lock:
            runs = self._runs.get(tab, [])
            if owned in runs:
                runs.remove(owned)
            if not runs:
                self._runs.pop(tab, None)

    def stop(self, tab: str) -> int:
        """Stop: cancel every run of the tab; how many requests were asked to stop."""
        with self._lock:
            runs = list(self._runs.get(tab, []))
        for run in runs:
            run.cancel()
        return sum(r.size for r in runs)

    def closed(self, tab: str) -> None:
        """A tab closed (or its client left for good): its runs stop, its files go, its runs leave memory
        (Gradio keeps a closed tab's state for an hour)."""
        client_left(self.stop(tab), "page closed")
        self._release(tab)

    def _release(self, tab: str) -> None:
        """The tab's files go, and its runs leave memory."""
        with self._lock:
            keys = self._keys.pop(tab, set()) | {tab}
        for key in keys:
            self.keeping.files.release(key)
            self.keeping.held.release(key)

    def _start(self, tab: str, call: RunRequest, stream: bool = True) -> tuple[_Owned, Run]:
        """The call counted against the tab's cap and started (its owner and its run); ValueError: one sentence."""
        owned = self._own(tab, len(call.prompts))
        try:
            run = owned.run = self.backend.start(call, stream=stream)
        except BaseException:
            self._disown(tab, owned)
            raise
        return owned, run

    # ------------------------------------------------------------------ the page's streams

    def stream(self, request: object, call: RunRequest, keeper: Keeper | None = None, kept_as: str = "") -> Iterator[Tick]:
        """One run for the page: `call` (made by `Backend.request`) started for the request's tab, recorded
        into `keeper` (kept as `kept_as`; None: not kept) and streamed as ticks its visitor can take. A run
        refused or failed ends with a tick whose `failure` says why; its requests end with the stream,
        whatever ends it."""
        tab = tab_of(request)
        try:
            owned, run = self._start(tab, call)
        except ValueError as err:  # SettingsError is one; the tab's cap; a backend that refuses (gr.Error is one)
            yield Tick([], True, failure=err.message if isinstance(err, gr.Error) else str(err))
            return
        if getattr(run, "notice", ""):
            gr.Warning(run.notice)
        key = keep_key(tab, kept_as)
        recording = keeper.start(run_header(self.backend.info(), call.settings, call.prompts)) if keeper is not None else None
        if keeper is not None:
            with self._lock:
                self._keys.setdefault(tab, set()).add(key)
        started = time.monotonic()
        progress = Progress(run.size, recording)
        pace = Pace(paces_by_acks(request))
        try:
            for tick in ticks(lambda timeout: progress.add(run.poll(timeout)), lambda: progress.over, pace):
                if keeper is not None:
                    self.keeping.held.hold(key, keeper)  # a live run's recording grows: idle runs make room
                if tick.finished:
                    summary = run_summary([o.metrics for o in progress.outputs()], time.monotonic() - started)
                    if keeper is not None:
                        recording.summary = summary  # in its file's end line
                    file = self._save(key, keeper, recording) if keeper is not None else None
                    tick = replace(tick, summary=summary, file=file)
                yield replace(tick, started=started)
        except Exception as err:  # e.g. ZeroGPU refused the call (quota, queue, duration)
            if not isinstance(err, gr.Error):
                log.exception("a run's stream failed")
            sentence = err.message if isinstance(err, gr.Error) else f"The run failed: {first_line(err)}"
            yield Tick([], True, pace, failure=sentence, started=started)
        except GeneratorExit:  # Gradio closed the stream: its client has gone (tab closed, process died)
            client_left(run.size - progress.ended(), "stream closed")
            self._release(tab)  # as the unload hook does: this stream may have held the run again after it
            raise
        finally:
            pace.close()
            run.close()  # a closed page: free the slots; a no-op for requests already done
            self._disown(tab, owned)
            if keeper is not None:
                keeper.live = False

    def _save(self, key: str, keeper: Keeper, recording: Recording) -> str | None:
        """A run ended: its file written for Download run, and what it holds counted under the cap (still
        live: it becomes evictable when its stream has sent its last frame); None when the disk refused."""
        self.keeping.held.hold(key, keeper)
        try:
            return self.keeping.files.save(key, recording.save)
        except OSError as err:  # a full or read-only disk, or past the cap: the run still shows, only the file is missing
            log.warning("could not write the run's file: %s", err)
            return None

    def paced(self, request: object, updates: Iterable[T], last: Callable[[T], bool],
              keepalive: float = KEEPALIVE_S) -> Iterator[tuple[T, Pace | None]]:
        """`updates` (cheap states: a replay's steps) as the request's visitor can take them: (update, pace)
        to draw and send through `pace.stamp`, or (update, None) at most every `keepalive` seconds while
        they cannot (draw nothing); the `last` always goes."""
        pace = Pace(paces_by_acks(request))
        shown = time.monotonic()
        try:
            for update in updates:
                if last(update) or pace.ready():
                    shown = time.monotonic()
                    yield update, pace
                elif time.monotonic() - shown >= keepalive:
                    shown = time.monotonic()
                    yield update, None
        finally:
            pace.close()

    # ------------------------------------------------------------------ kept runs

    def hold(self, request: object, keeper: Keeper) -> None:
        """The tab's run (a loaded one) counted under the memory cap."""
        self.keeping.held.hold(tab_of(request), keeper)

    def read_upload(self, request: object, file: object, busy: str = "") -> Recording:
        """The run in an uploaded file (at most MAX_FILE_BYTES read), the file removed whatever it held, and
        the tab's last run file released (Download run then offers nothing); gr.Error with one sentence for
        anything that is not a run, or `busy` when the tab cannot take one now (the file goes unread)."""
        path = file if isinstance(file, str) else getattr(file, "name", None)
        try:
            if busy or not path:
                raise gr.Error(busy or "No file arrived; choose a run file (.jsonl) again.", print_exception=False)
            recording = load_file(path)
        except RecordingError as err:
            raise gr.Error(str(err), print_exception=False) from None
        except OSError as err:
            raise gr.Error(f"The file could not be read: {err.strerror or err}.", print_exception=False) from None
        finally:
            self.keeping.files.remove(path or "")
        self.keeping.files.release(tab_of(request))
        return recording

    # ------------------------------------------------------------------ the API

    def results(self, tab: str, prompts: object, raw: Any, record: bool) -> Results:
        """One call run to its end for `tab` (no step frames unless `record`: then its recording, counted
        under the memory cap while the call runs). ValueError: one sentence."""
        call = self.backend.request(prompts, raw)
        settings, batch = call.settings, call.prompts  # checked: past here nothing parses
        held_as = f"api {tab} {id(call)}"  # the recording's key under the memory cap, while the call runs
        facts = self.backend.info()
        if record:
            most = recording_bound(len(batch), settings.max_new_tokens, settings.params.max_denoising_steps,
                                   facts.get("canvas_length") or 256, facts.get("vocab_size") or 262_144)
            if not self.keeping.held.admit(held_as, most):
                raise ValueError(NO_ROOM)
        try:
            owned, run = self._start(tab, call, stream=record)  # step frames only for a recording
            recording = Recording(run_header(facts, settings, batch)) if record else None
            started = time.monotonic()
            try:
                progress = read_run(run, recording)
                outputs, plans = progress.outputs(), progress.plans
            finally:
                run.close()
                self._disown(tab, owned)
            summary = run_summary([o.metrics for o in outputs], time.monotonic() - started)
            if recording is not None:
                recording.summary = summary
            return Results(outputs, plans, summary, recording and recording.text(), getattr(run, "pid", None))
        finally:
            self.keeping.held.release(held_as)  # after the file's text is made: it counts while it lives


def client_left(cancelled: int, how: str) -> None:
    """The one log line for requests cancelled because their client went away (none: no line)."""
    if cancelled:
        log.info("client left (%s): cancelled %d unfinished requests", how, cancelled)
