"""The memory ledger on the page, in a real chromium on a real server: a lesson budget too small for the run
is one sentence within two seconds and starts nothing; the step-through draws each call's ledger, the untiled
call's bar over the budget and labelled, the tiled calls' under it; an out-of-memory is said once."""

from __future__ import annotations

import re

import pytest

from browser_page import chromium_page
from lesson_budget import lesson_budget
from test_browser import shots  # noqa: F401  (the screenshots folder fixture)
from test_lesson_overview import set_number

# The lesson's count of the out-of-memory sentence and of the cards saying "out of memory", at every change of
# the page (a MutationObserver, not a timer: the untiled board's last frame can stand for less than a timer's period
# before the tiled run's first frame replaces it, and a busy CI machine delays timers further).
COUNT = """() => {
  window.__said = [];  // textContent: no layout forced at each change (the tab's result boxes and its board hold all it says)
  const said = () => [...document.querySelectorAll('.lesson-result, #lesson-board')].map(e => e.textContent).join(' ');
  const count = () => window.__said.push([said().split('torch.OutOfMemoryError').length - 1,
    [...document.querySelectorAll('#lesson-board .card .status')].filter(s => s.textContent.includes('out of memory')).length]);
  new MutationObserver(count).observe(document.body, {subtree: true, childList: true, characterData: true});
}"""
# Each bar's stack in the step-through's chart: [call, held + tile (what the call needed), budget, annotations].
BARS = """() => { const p = document.querySelector('#lesson-memory .js-plotly-plot'); if (!p?.data?.length) return null;
  const bars = p.data.filter(t => t.type === 'bar' && t.name !== 'free'), line = p.data.find(t => t.name.startsWith('budget'));
  return [bars[0].x.map((x, i) => [x, bars.reduce((s, t) => s + t.y[i], 0)]), line?.y[0],
          (p.layout.annotations || []).map(a => a.text)]; }"""


@pytest.fixture(scope="module")
def page(browser, app_server):
    with chromium_page(browser, app_server.url, width=1366, height=768, idle=True) as page:
        page.server = app_server
        page.get_by_role("tab", name="Tiling vs OOM").click()
        yield page


# The page's own clock from the press on Run to the untiled card's answer on screen: a loaded test process (or
# Playwright's checks before its click) adds nothing to what a visitor waits.
TIME_THE_ANSWER = """() => { document.querySelector('#lesson-untiled [data-outcome]')?.remove();  // the last answer gone
  window.__answer = [null, null];
  document.querySelector('#lesson-run').addEventListener('click', () => window.__answer[0] = performance.now(),
                                                         {capture: true, once: true});
  const box = document.querySelector('#lesson-untiled');
  const seen = new MutationObserver(() => { if (box.querySelector('[data-outcome]')) {
    window.__answer[1] = performance.now(); seen.disconnect(); } });
  seen.observe(box, {subtree: true, childList: true}); }"""


def model_scale_suggestion(page, model, requests: int) -> str:
    """Wait until the lesson's budget box holds its suggestion for `requests` at the model's own scale; return it."""
    expected = lesson_budget(model, requests, max_num_seqs=32)  # app.py's --max-num-seqs
    page.wait_for_function(f"() => document.querySelector('#lesson-budget textarea').value === {expected!r}",
                           timeout=30_000)
    return expected


def refusal_after_run(page, budget: str) -> tuple[str, float]:
    """Type `budget`, press Run; the untiled card's sentence and the seconds it took."""
    page.locator("#lesson-budget textarea").fill(budget)
    page.evaluate(TIME_THE_ANSWER)
    page.click("#lesson-run")
    page.wait_for_function("() => window.__answer[1] !== null", timeout=30_000)
    clicked, answered = page.evaluate("() => window.__answer")
    return page.inner_text("#lesson-untiled"), (answered - clicked) / 1e3


def test_a_real_scale_budget_inside_the_gap_is_refused_in_one_sentence_and_nothing_runs(page, app_model):
    """Just above what the idle engine holds (weights and its sampler's state, 4.5 MiB), then half of what
    the run needs: each is refused within 2 s, naming the shortfall and the budget to type, and no run starts."""
    set_number(page, "lesson-requests", 16)
    set_number(page, "lesson-denoising-steps", 2)
    small = model_scale_suggestion(page, app_model, 16)
    page.check("#lesson-real-scale input")
    page.wait_for_function(f"() => document.querySelector('#lesson-budget textarea').value !== {small!r}", timeout=30_000)
    suggested = page.locator("#lesson-budget textarea").input_value()
    first, seconds = refusal_after_run(page, "4700KiB")
    needed = float(re.search(r"it needs ([\d.]+) MiB", first).group(1))
    second, seconds_2 = refusal_after_run(page, f"{int(needed / 2)}MiB")
    for card, took in ((first, seconds), (second, seconds_2)):
        assert took < 2, (took, card)
        assert "cannot hold this run" in card and f"the suggested budget for 16 requests is {suggested}." in card, card
        assert "this run's sampler state" in card and "one request's sampler step" in card, card
        assert "not run yet" in page.inner_text("#lesson-tiled") and "not run yet" in page.inner_text("#lesson-chunked")
        assert page.locator("#lesson-board .card").count() == 0  # no run started: no canvas was drawn
    assert "\n" not in first.split("not run.")[1].strip()
    page.uncheck("#lesson-real-scale input")
    assert not page.errors, page.errors


def test_the_step_through_draws_each_calls_ledger_and_an_out_of_memory_is_said_once(page, shots, app_model):  # noqa: F811
    page.evaluate(COUNT)
    set_number(page, "lesson-requests", 16)
    set_number(page, "lesson-denoising-steps", 3)
    page.locator("#lesson-budget textarea").fill(model_scale_suggestion(page, app_model, 16))  # typed, as a visitor would
    page.click("#lesson-run")
    page.wait_for_selector("#lesson-verdict [data-outcome]", timeout=240_000)
    said = page.evaluate("() => window.__said")
    assert max(n for n, _ in said) == 1, said  # the untiled run's card, not one per request
    assert max(cards for _, cards in said) == 16, said  # every card of the untiled run said it ran out, in two words
    page.wait_for_function(f"() => ({BARS})()?.[2]?.length", timeout=30_000)  # the untiled run's chart, after Run
    bars, budget, labels = page.evaluate(BARS)
    assert len(bars) == 1 and bars[0][1] > budget, (bars, budget)  # the untiled call's one tile crosses the budget
    assert any(label.startswith("Tried to allocate") and "is free" in label for label in labels), labels
    page.locator("#lesson-memory").scroll_into_view_if_needed()
    page.screenshot(path=str(shots / "lesson-ledger.png"))  # what a projector at 1366 x 768 shows
    page.get_by_label("Tiled (auto)", exact=True).check()
    page.wait_for_function(f"() => ({BARS})()?.[0]?.length > 1", timeout=30_000)
    bars, budget, labels = page.evaluate(BARS)
    assert all(total <= budget for _, total in bars), (bars, budget)  # every tiled call fits under the line
    assert not labels
    assert not page.errors, page.errors
