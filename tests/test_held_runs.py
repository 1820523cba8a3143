"""What all tabs keep in memory has a cap: many sessions' runs stay under it, the least recently
viewed idle run goes first (and its tab is told), a live run is never evicted, a closed tab frees
its share, and an API call's recording that cannot fit is refused. The holders are the page's own
Playback objects, holding real recordings."""

from __future__ import annotations

import time
import tracemalloc

import pytest

from dgemma.serving.held_runs import EVICTED, HeldRuns
from dgemma.recording import MAX_POSITIONS, load, recording_bound
from dgemma.ui.board import fold, held_bytes
from dgemma.ui.generate_tab.playback import Playback, status, view
from test_recording import run_of

RUN = run_of(8, 12, 16).text()  # a run of the embedded model's shape: 8 requests, 12 steps, canvas 16


def tab_with_a_run(viewed: float) -> Playback:
    tab = Playback()
    tab.recording, tab.last_used = load(RUN), viewed
    return tab


def test_many_sessions_stay_under_the_cap_and_the_least_recently_used_idle_runs_go_first():
    one = tab_with_a_run(0).held_bytes()
    held = HeldRuns(max_bytes=int(3.5 * one))
    tabs = {f"tab {i}": tab_with_a_run(viewed=0) for i in range(10)}
    done: list[str] = []
    kept = lambda: [s for s in done if tabs[s].recording is not None]  # noqa: E731
    for session, tab in tabs.items():  # each tab's run finishes in turn (holding it is using it)
        done.append(session)
        held.hold(session, tab)
        assert held.total <= held.max_bytes
        if session == "tab 5":
            assert kept() == ["tab 3", "tab 4", "tab 5"]
            tabs["tab 3"].last_used = time.monotonic()  # someone moves tab 3's slider
        if session == "tab 6":
            assert kept() == ["tab 3", "tab 5", "tab 6"]  # tab 4 went: held after tab 3, viewed before it
    assert kept() == ["tab 7", "tab 8", "tab 9"]
    assert len(held) == 3 and held.evicted == 7
    assert all(tabs[s].evicted == EVICTED for s in done if s not in kept())
    assert EVICTED.count(".") == 1 and EVICTED.endswith(".")  # one sentence, said at the tab's next view


def test_a_live_run_is_never_evicted_and_the_one_being_held_stays():
    one = tab_with_a_run(0).held_bytes()
    held = HeldRuns(max_bytes=one)
    live = tab_with_a_run(viewed=0)
    live.live = True
    held.hold("live", live)
    held.hold("new", tab_with_a_run(viewed=50))
    assert live.recording is not None and len(held) == 2  # over the cap, but nothing idle to evict
    held.hold("newer", tab_with_a_run(viewed=60))
    assert len(held) == 2 and live.recording is not None  # "new" went: idle, and not the one held now


def test_a_closed_tab_frees_its_share_at_once():
    held = HeldRuns(max_bytes=2**30)
    tab = tab_with_a_run(viewed=0)
    held.hold("tab", tab)
    share = held.total
    assert held.release("tab") == share and held.total == 0
    assert tab.recording is None and tab.evicted == ""  # Gradio keeps its state an hour: the run is dropped now


def test_a_recorded_api_call_that_cannot_fit_beside_live_runs_is_refused_and_one_that_can_evicts_idle_runs():
    most = recording_bound(8, 256, 64, 16, 45)
    held = HeldRuns(max_bytes=3 * most)
    held.hold("idle tab", tab_with_a_run(viewed=0))
    assert held.admit("call 1", most) and held.admit("call 2", most)
    assert held.admit("call 3", most)  # the idle tab's run made room
    assert len(held) == 3 and not held.admit("call 4", most)  # three live calls fill the cap
    held.release("call 1")
    assert held.admit("call 4", most)


def test_the_bound_of_a_recording_is_what_the_recording_can_hold_at_most():
    assert recording_bound(32, 256, 512, 256, 262_144) >= 13 * MAX_POSITIONS  # the released model at the bound
    recording = load(RUN)  # 8 requests x 12 steps of one canvas of 16, its token ids from a vocabulary of 262,144
    assert recording.held_bytes <= recording_bound(8, 16, 12, 16, 262_144) <= 2 * recording.held_bytes


def test_what_a_tab_says_it_holds_is_its_recording_and_its_board_within_a_factor_of_two():
    tab = tab_with_a_run(viewed=0)
    view(tab.recording, 6, tab.kept)
    board = fold(tab.recording.events(6))
    assert tab.held_bytes() == tab.recording.held_bytes + held_bytes(board)
    tracemalloc.start()
    recording = load(RUN)
    again = fold(recording.events(6))
    counted, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert 0.5 * counted <= recording.held_bytes + held_bytes(again) <= 2 * counted, counted


@pytest.mark.parametrize("sessions", [200])
def test_holding_runs_of_many_sessions_costs_little(sessions):
    held = HeldRuns(max_bytes=10 * tab_with_a_run(0).held_bytes())
    tabs = [tab_with_a_run(viewed=i) for i in range(sessions)]
    started = time.perf_counter()
    for i, tab in enumerate(tabs):
        held.hold(f"tab {i}", tab)
    assert len(held) == 10 and time.perf_counter() - started < 2.0


def test_a_finished_run_stays_unevictable_until_its_stream_has_sent_its_last_frame(tmp_path, tiny_model):
    """The service counts the run and writes its file while the run is still live: the stream's last
    frame still reads the recording (a race with another tab's hold once evicted it mid-frame)."""
    from dgemma.engine import EngineConfig
    from dgemma.serving.engine_backend import EngineBackend
    from dgemma.settings import Limits
    from dgemma.serving.runfiles import RunFiles
    from dgemma.serving.runs import Keeping, RunService

    class Request:
        session_hash = "tab"

    backend = EngineBackend(tiny_model, EngineConfig(max_num_seqs=2), Limits(), None)
    try:
        service = RunService(backend, Keeping(RunFiles(tmp_path, 2**30, 3600), HeldRuns(max_bytes=1)))
        tab = Playback()
        ticks = service.stream(Request(), backend.request(["add 1+2"], {"max_denoising_steps": 2, "seed": 1}), tab)
        last = next(tick for tick in ticks if tick.finished)
        service.keeping.held.hold("other tab", tab_with_a_run(viewed=0))  # over the cap at once
        assert tab.recording is not None and last.file and tab.live  # the stream has not ended yet
        assert status(tab, tab.recording, 0).startswith("Replay of the run:")  # but the run has: not "live"
        assert list(ticks) == []  # the stream ends after its last tick
    finally:
        backend.close()
    assert not tab.live
    service.keeping.held.hold("third tab", tab_with_a_run(viewed=0))
    assert tab.recording is None and tab.evicted == EVICTED
