"""Playback in a real browser: Playwright driving Debian's chromium against `python app.py`.

After a Run the step slider sets every card to its state at step k (0: the random canvases; the
last step: the final texts), play at 1 s per step shows each step in turn, and a downloaded run
reloads in a fresh app with identical frames. Screenshots as in test_browser.py
(DGEMMA_SCREENSHOTS=assets/screenshots refreshes the README's).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from playwright.sync_api import TimeoutError as PlaywrightTimeout

from app_server import MODEL_ARGS, launch
from browser_page import chromium_page, go_to
from dgemma.ui.generate_tab.playback import DEFAULT_PACE_S, SEND_AHEAD_S
from test_browser import shots  # noqa: F401  (the screenshots folder fixture)
ALL_DONE = "() => [...document.querySelectorAll('#cards .card')].every(c => c.classList.contains('status-done'))"
# Every element of the cards with its attributes (sorted: the DOM may keep them in either order) and text.
CARDS = ("() => [...document.querySelectorAll('#cards .board *')].map(e => [e.tagName, "
         "[...e.attributes].map(a => a.name + '=' + a.value).sort(), "
         "[...e.childNodes].filter(n => n.nodeType === 3).map(n => n.data).join('')])")
PLOTS = ("() => ['#entropy-plot', '#tile-plot'].map(id => document.querySelector(id + ' .js-plotly-plot')"
         ".data.map(t => [t.name, t.x, t.y]))")


def status(page) -> str:
    return page.inner_text("#status")


def shown_step(page) -> tuple[int, int] | None:
    """(k, last) while the status line reads "Replay of the run: step k of last ..."."""
    m = re.search(r"Replay of the [a-z ]*run: step (\d+) of (\d+)", status(page))
    return (int(m[1]), int(m[2])) if m else None


def go_to_call(page, step: int) -> None:
    """`go_to` the step, and wait until the charts show it too."""
    go_to(page, step)
    # Plotly draws after the status line changes: wait until the tile chart marks this call.
    page.wait_for_function("() => (document.querySelector('#tile-plot .js-plotly-plot')?.layout?.annotations || [])"
                           f".some(a => a.text === 'call {step}')", timeout=30_000)


def upload(page, path: Path) -> None:
    """Load a run as a user does: click "Load a run" and pick the file."""
    with page.expect_file_chooser() as chooser:
        page.click("#load-run")
    chooser.value.set_files(str(path))


@pytest.fixture(scope="module")
def ran(browser, app_server):
    """One Run of 8 requests, 2 canvases each, finished: the page, the final texts, the last step."""
    with chromium_page(browser, app_server.url, idle=True) as page:
        page.get_by_text("Settings (the model's defaults)").click()
        page.get_by_label("max new tokens").fill("32")
        page.get_by_label("max new tokens").press("Tab")
        page.get_by_text("Settings (the model's defaults)").click()
        page.click("#run")
        page.wait_for_selector("#cards .card", timeout=60_000)
        page.wait_for_function(ALL_DONE, timeout=120_000)
        page.wait_for_function("() => document.querySelector('#download-run') && !document.querySelector('#download-run').disabled",
                               timeout=30_000)
        finals = [t.strip() for t in page.locator("#cards .card .committed").all_inner_texts()]
        last = int(page.locator("#step-slider input[type=number]").input_value())
        yield page, finals, last


def test_the_slider_at_0_shows_every_random_canvas_and_at_the_end_the_final_texts(ran, shots):  # noqa: F811
    page, finals, last = ran
    assert last >= 2 and all(finals), finals
    go_to_call(page, 0)
    cards = page.locator("#cards .card")
    assert cards.count() == 8
    for i in range(8):
        card = cards.nth(i)
        assert card.locator(".status").inner_text().startswith("random start (step 0 of"), card.inner_text()
        assert card.locator(".canvas .tok.noise").count() > 0 and card.locator(".canvas .tok.acc").count() == 0
        assert "nothing committed yet" in card.locator(".committed").inner_text()
    go_to_call(page, last // 3)
    page.screenshot(path=str(shots / "generate-paused.png"), full_page=True)
    go_to_call(page, last)
    assert [t.strip() for t in page.locator("#cards .card .committed").all_inner_texts()] == finals
    assert page.locator("#cards .card.status-done").count() == 8
    assert not page.errors, page.errors


def test_play_at_one_second_per_step_shows_each_step_in_turn_skipping_only_late_ones(ran):
    page, _, last = ran
    go_to_call(page, 0)
    # Each step the status line shows, with its seconds since just before the click on Play.
    page.evaluate("""() => { window.__steps = []; window.__t0 = performance.now();
      new MutationObserver(() => { const m = /Replay[^]*step (\\d+) of/.exec(document.querySelector('#status').innerText);
        if (m && window.__steps.at(-1)?.[0] !== +m[1]) window.__steps.push([+m[1], (performance.now() - window.__t0) / 1e3]); })
      .observe(document.querySelector('#status'), {subtree: true, childList: true, characterData: true}); }""")
    page.click("#play")  # the pace slider is at its default, DEFAULT_PACE_S a step
    end = min(last, 4)
    page.wait_for_function(f"() => window.__steps.some(([step]) => step >= {end})", timeout=60_000)
    page.click("#pause")
    page.wait_for_function("() => document.querySelector('#status').innerText.includes('(paused)')", timeout=30_000)
    paused_at = shown_step(page)[0]
    seen = page.evaluate("() => window.__steps")
    steps = [step for step, _ in seen]
    assert steps[0] == 0 and steps == sorted(set(steps)), seen  # forward from where play started
    # Each step in turn, never sooner than its time (sent SEND_AHEAD_S early). A busy machine may skip
    # steps whose frames would come late (the replay keeps to the clock): the step shown then is the
    # one due nearest to now, k no sooner than k - 0.5 steps after play started (PlayClock.next_step).
    for (shown, _), (step, at) in zip(seen, seen[1:]):
        if step == shown + 1:
            assert at >= step * DEFAULT_PACE_S - SEND_AHEAD_S, seen
        else:
            assert at >= (step - 0.5) * DEFAULT_PACE_S, seen
    # A paused replay stays where it is: a step the play stream still sent would show within two
    # ticks (1 s each), and none does (a busy machine can only make such a step later, never earlier).
    with pytest.raises(PlaywrightTimeout):
        page.wait_for_function(f"() => window.__steps.length > {len(seen)}", timeout=2_500)
    assert shown_step(page)[0] == paused_at and "(paused)" in status(page)


def test_a_pause_holds_when_the_play_stream_ends_before_its_cancel_arrives(ran):
    """Pause cancels the play stream; if its cancel is late (a busy server), the stream sees the pause
    at its next tick and ends by itself, and Gradio then sends the stream's last values once more.
    Those must leave the paused view alone: they once put the last frame, "playing…", back over it."""
    page, _, _ = ran
    go_to_call(page, 0)
    held = []
    page.route("**/gradio_api/cancel", lambda route: held.append(route))  # the cancel waits until the stream has ended by itself
    try:
        page.click("#play")
        page.wait_for_function("() => /step [1-9]\\d* of \\d+ \\(playing/.test(document.querySelector('#status').innerText)",
                               timeout=60_000)
        page.click("#pause")
        page.wait_for_function("() => document.querySelector('#status').innerText.includes('(paused)')", timeout=30_000)
        paused = status(page)
        # The stream's next tick is at most one step (1 s) away: it sees the pause then and ends. Any
        # later change of the status line would show within three steps (a busy machine: later, never earlier).
        with pytest.raises(PlaywrightTimeout):
            page.wait_for_function("(paused) => document.querySelector('#status').innerText !== paused", arg=paused,
                                   timeout=3_000)
        assert held, "the pause sent no cancel"
    finally:
        for route in held:
            route.continue_()
        page.unroute("**/gradio_api/cancel")


def test_a_downloaded_run_reloads_in_a_fresh_app_with_identical_frames(ran, browser, tmp_path):
    page, _, last = ran
    frames = []
    for step in range(last + 1):
        go_to_call(page, step)
        frames.append((page.evaluate(CARDS), page.evaluate(PLOTS)))
    with page.expect_download() as download:
        page.click("#download-run")
    path = tmp_path / "run.jsonl"
    download.value.save_as(path)

    # A fresh app (another process: nothing of the first run in it).
    fresh = launch(MODEL_ARGS, tmp_path / "fresh.log")
    try:
        with chromium_page(browser, fresh.url, idle=True) as other:
            upload(other, path)
            other.wait_for_function("() => /Replay[^]*step 0 of/.test(document.querySelector('#status').innerText)",
                                    timeout=30_000)
            assert shown_step(other) == (0, last)
            for step in range(last + 1):
                go_to_call(other, step)
                assert (other.evaluate(CARDS), other.evaluate(PLOTS)) == frames[step], step
            assert not other.errors, other.errors
            bad = tmp_path / "cut.jsonl"
            bad.write_bytes(path.read_bytes()[:-200])
            upload(other, bad)
            other.wait_for_selector("text=This run file is cut short", timeout=30_000)
    finally:
        fresh.stop()


def test_the_lessons_runs_step_call_by_call_showing_each_tiles_requests_and_memory(browser, app_server):
    # The model's own lesson budget: the untiled run runs out of memory.
    with chromium_page(browser, app_server.url, idle=True) as page:
        page.get_by_role("tab", name="Tiling vs OOM").click()
        page.click("#lesson-run")
        page.wait_for_selector("#lesson-verdict [data-outcome]", timeout=120_000)
        # The untiled run: its one call is the out-of-memory one, every request in one tile.
        page.wait_for_selector("#lesson-call .lesson-call.oom", timeout=30_000)
        assert re.search(r"one tile holding requests #1–#\d+\. It needs .+ free: out of memory", page.inner_text("#lesson-call"))
        page.get_by_label("Tiled (auto)").check()
        page.wait_for_selector("#lesson-call [data-call='1'].ok", timeout=30_000)
        first = page.inner_text("#lesson-call")
        assert re.search(r"tile 1: (\d+) requests, #1–#\1 · about", first) and "tile 2:" in first, first
        page.click("#lesson-forward")
        page.wait_for_selector("#lesson-call [data-call='2']", timeout=30_000)
        page.wait_for_function("() => (document.querySelector('#lesson-plot .js-plotly-plot')?.layout?.annotations || [])"
                               ".some(a => a.text === 'call 2')", timeout=30_000)  # the chart marks the call
        assert not page.errors, page.errors
