"""A real browser on the real app: Playwright driving Debian's chromium against `python app.py`.

Click Run: every card ends with its text, both charts hold data. A run that outlasts any page: a card's
canvas changes from step to step.
Tiling vs OOM: the untiled run shows the out-of-memory message, the tiled run succeeds, the
tokens are identical. Screenshots go to a temporary folder; to refresh the ones README.md shows,
run with DGEMMA_SCREENSHOTS=assets/screenshots (a plain test run never touches tracked files).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from app_server import ROOT
from browser_page import chromium_page, typed
from vanishing import BOUND_S, wait_until

from dgemma.serving.acks import ACK_PATH, COOKIE

SHOTS_ENV = os.environ.get("DGEMMA_SCREENSHOTS")


@pytest.fixture(scope="module")
def shots(tmp_path_factory) -> Path:
    folder = (ROOT / SHOTS_ENV) if SHOTS_ENV else tmp_path_factory.mktemp("screenshots")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture(scope="module")
def page(browser, app_server):
    server = app_server
    with chromium_page(browser, server.url) as page:
        for selector in ("#run", "#cards", "#status", "#entropy-plot", "#tile-plot"):  # the whole page is up
            page.wait_for_selector(selector, timeout=60_000)
        page.server = server
        yield page


# Records, for every card, the canvas shown at every step the page displayed: frames can come
# faster than a test can poll, so the page itself keeps the history.
RECORD = """() => {
  window.__seen = {};
  const record = () => document.querySelectorAll('#cards .card').forEach(c => {
    const canvas = c.querySelector('.canvas');
    if (+c.dataset.step > 0 && canvas) (window.__seen[c.dataset.request] ||= {})[c.dataset.step] = canvas.textContent;  // textContent: a card off screen is not rendered (content-visibility)
  });
  new MutationObserver(record).observe(document.querySelector('#cards'),
    {subtree: true, childList: true, characterData: true, attributes: true});
}"""


ALL_ENDED = "() => { const cards = [...document.querySelectorAll('#cards .card')]; " \
           "return cards.length > 0 && cards.every(c => /status-(done|cancelled)/.test(c.className)); }"


def ask_for(page, *settings: tuple[str, str], requests: str | None = None) -> None:
    """`settings` (label, value) in the Generate tab's Settings accordion, and `requests` concurrent requests when
    given, each kept as typed."""
    page.get_by_role("tab", name="Generate").click()
    page.get_by_text("Settings (the model's defaults)").click()
    count = [(page.locator("input[type=number]").first, requests)] if requests else []
    typed(*count, *((page.get_by_label(label, exact=True), value) for label, value in settings))
    page.get_by_text("Settings (the model's defaults)").click()


def test_a_run_ends_with_every_cards_text_and_both_charts_drawn(page, shots):
    ask_for(page, ("max new tokens", "256"), requests="32")
    page.click("#run")
    page.wait_for_function(ALL_ENDED, timeout=300_000)
    assert page.locator("#cards .card.status-done").count() == page.locator("#cards .card").count() == 32
    # Both charts hold data: a line per request (a colour's lines are one trace, None between two), and
    # the tile chart's lines over the sampler calls.
    lines = page.evaluate("() => document.querySelector('#entropy-plot .js-plotly-plot').data.filter((t) => t.mode === 'lines')"
                          ".reduce((n, t) => n + t.x.filter((x, i) => x !== null && (i === 0 || t.x[i - 1] === null)).length, 0)")
    assert lines == page.locator("#cards .card").count()
    assert page.locator("#tile-plot .scatterlayer .trace").count() >= 5
    calls = page.evaluate("() => document.querySelector('#tile-plot .js-plotly-plot').data[0].x.length")
    assert calls >= 3, calls
    assert page.locator("#cards .card .committed").first.inner_text().strip()
    page.screenshot(path=str(shots / "generate.png"), full_page=True)
    assert not page.errors, page.errors


def test_lesson_untiled_runs_out_of_memory_tiled_completes(page, shots):
    page.get_by_role("tab", name="Tiling vs OOM").click()
    page.click("#lesson-run")
    page.wait_for_selector("#lesson-verdict [data-outcome]", timeout=240_000)
    untiled = page.inner_text("#lesson-untiled")
    assert page.locator("#lesson-untiled [data-outcome=oom]").count() == 1, untiled
    assert "out of memory" in untiled and "Needed" in untiled and "free" in untiled
    assert page.locator("#lesson-tiled [data-outcome=ok]").count() == 1, page.inner_text("#lesson-tiled")
    assert page.locator("#lesson-chunked [data-outcome=skipped]").count() == 1, page.inner_text("#lesson-chunked")
    assert page.locator("#lesson-verdict [data-outcome=identical]").count() == 1, page.inner_text("#lesson-verdict")
    assert page.evaluate("() => document.querySelector('#lesson-plot .js-plotly-plot').data[0].x.length") >= 1
    page.screenshot(path=str(shots / "lesson.png"), full_page=True)
    assert not page.errors, page.errors


MINUTES_OF_WORK = (("max new tokens", "256"), ("denoising steps", "512"), ("confidence threshold", "1e-9"),
                   ("stability threshold", "8"))


def ask_for_minutes_of_work(page, requests: str | None = None) -> None:
    """Settings under which no canvas converges (a confidence threshold nothing reaches): every
    request takes all 512 steps of each of its 16 canvases, so the run outlasts any test's action."""
    ask_for(page, *MINUTES_OF_WORK, requests=requests)


def test_a_running_cards_canvas_changes_from_step_to_step(page, shots):
    # How many steps a page is sent depends on how fast it draws them: it gets the next frame once it has drawn the
    # last (dgemma/serving/acks.py). A run that outlasts any page is sent step after step, however slow the page.
    page.evaluate(RECORD)
    ask_for_minutes_of_work(page, requests="32")  # as the README's screenshot of a run shows it
    page.click("#run")
    page.wait_for_function("() => Object.values(window.__seen).some((steps) => new Set(Object.values(steps)).size >= 2)",
                           timeout=120_000)
    page.screenshot(path=str(shots / "generate-live.png"), full_page=True)
    page.click("#stop")
    page.wait_for_function(ALL_ENDED, timeout=120_000)


def test_stop_cancels_this_sessions_requests(page):
    ask_for_minutes_of_work(page)  # still running when Stop is pressed, however slow the machine
    page.click("#run")
    page.wait_for_selector("#cards .card.status-running", timeout=120_000)
    page.click("#stop")
    page.wait_for_function(ALL_ENDED, timeout=120_000)
    assert page.locator("#cards .card.status-cancelled").count() == page.locator("#cards .card").count()


def test_explorer_chart_renders_and_follows_the_gpu(page, shots):
    page.get_by_role("tab", name="Tiling vs OOM").click()
    plot = "document.querySelector('#explorer-plot .js-plotly-plot')"
    page.wait_for_function(f"() => {plot}?.layout?.title?.text?.includes('H200')", timeout=180_000)
    h200 = page.evaluate(f"() => {plot}.data.map(t => t.name)")
    assert h200[:4] == ["untiled (one tile)", "seed heuristic (×10 guess)", "calibrated tiling", "chunked step"]
    assert "untiled runs out of memory" in h200 and any(n.startswith("free memory") for n in h200)
    assert "On an H200 141 GB" in page.inner_text("#explorer-sentence")
    assert page.locator("#explorer-table tbody tr").count() == 7

    def pick(label: str) -> None:
        page.locator("#explorer-gpu input").click()
        page.get_by_role("option", name=label, exact=True).click()
        page.wait_for_function(f"() => {plot}?.layout?.title?.text?.includes('{label}')", timeout=120_000)

    pick("L4 24 GB")
    l4 = page.evaluate(f"() => {plot}.data.map(t => t.name)")
    assert l4 != h200 and not any(n.startswith("free memory") for n in l4)
    assert "does not fit in bf16" in page.inner_text("#explorer-sentence")
    pick("A100 80 GB")
    assert "untiled runs out of memory at 32 requests" in page.inner_text("#explorer-sentence")
    page.locator("#explorer").screenshot(path=str(shots / "explorer.png"))
    assert not page.errors, page.errors


def test_a_too_small_lesson_budget_is_one_sentence_on_its_card(page):
    page.get_by_role("tab", name="Tiling vs OOM").click()
    budget = page.locator("#lesson-budget textarea")
    shown = budget.input_value()
    budget.fill("1KiB")
    page.click("#lesson-run")
    page.wait_for_selector("#lesson-untiled [data-outcome=error]", timeout=90_000)
    untiled = page.inner_text("#lesson-untiled")
    assert "cannot even hold the model weights" in untiled and "suggested budget" in untiled, untiled
    cards = page.inner_text("#lesson-tiled") + page.inner_text("#lesson-chunked") + page.inner_text("#lesson-verdict")
    assert "running" not in cards and "not run yet" in page.inner_text("#lesson-tiled"), cards
    budget.fill(shown)  # leave the tab as it was for the next test
    assert not page.errors, page.errors


# The cards' classes and steps, the frames the view drew and the status line.
SHOWN = """() => [[...document.querySelectorAll('#cards .card')].map(c => `${c.className}@${c.dataset.step}`),
  [...document.querySelectorAll('[data-frames]')].map(e => `${e.id}:${e.dataset.frames}`),
  document.querySelector('#status')?.innerText]"""


def test_a_closed_tab_cancels_its_requests_promptly_and_a_prompt_outside_the_tasks_gets_a_note(page):
    """A second tab asks the teaching model something it was never taught, for minutes of work, then closes."""
    with chromium_page(page.context.browser, page.server.url) as tab:  # a tab of its own session
        tab.wait_for_selector("#run:not([disabled])", timeout=60_000)
        tab.locator("#component-0 textarea, textarea").first.fill("what is 2+2?")
        ask_for_minutes_of_work(tab)
        tab.click("#run")
        try:
            tab.wait_for_selector("#cards .card.status-running", timeout=60_000)
        except Exception:  # what the tab showed, for a failure seen once in a whole-suite run and not reproduced
            shown = tab.evaluate(SHOWN)
            raise AssertionError(f"no running card: {shown}; page errors {tab.errors}; log {page.server.log()[-2000:]}") from None
        note = tab.locator("#cards .card .note").first.inner_text()
        assert "only knows its task families" in note and "example prompts" in note, note
        before = page.server.log().count("client left")
        tab.close()
        closed = time.monotonic()
    seen = wait_until(lambda: page.server.log().count("client left") > before, bound_s=60)
    assert seen is not None, page.server.log()[-2000:]
    print(f"cancelled {seen - closed:.2f} s after the tab closed")
    assert seen - closed <= BOUND_S, f"cancelled {seen - closed:.2f} s after the tab closed"


FRAMES = "() => +document.querySelector('#cards .dgv').dataset.frames"  # frames the Generate tab's board view drew


def test_a_page_whose_acknowledgement_is_lost_keeps_seeing_the_run(page):
    """The POST saying the run's first frame was drawn fails: after acks.STALLED_S of silence the stream
    sends again, so the view goes on moving instead of waiting for the run's last frame."""
    lost: list[str] = []

    def lose_the_first_frames_acknowledgement(route) -> None:
        if route.request.post_data and not lost:  # an empty body is the page saying it acknowledges
            lost.append(route.request.post_data)
            route.abort()
        else:
            route.continue_()

    with chromium_page(page.context.browser, page.server.url) as tab:
        tab.route(f"**{ACK_PATH}", lose_the_first_frames_acknowledgement)
        tab.wait_for_selector("#run:not([disabled])", timeout=60_000)
        paced = wait_until(lambda: any(c["name"] == COOKIE for c in tab.context.cookies()), bound_s=60)
        assert paced is not None, "the page never said it acknowledges the frames it draws"
        ask_for_minutes_of_work(tab)
        before = tab.evaluate(FRAMES)
        tab.click("#run")
        tab.wait_for_function(f"() => ({FRAMES})() >= {before + 5}", timeout=120_000)
        assert len(lost) == 1 and lost[0].endswith(" 1"), lost  # the run's first frame went unacknowledged
