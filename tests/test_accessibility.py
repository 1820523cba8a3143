"""The page for everyone: its text meets WCAG AA contrast (4.5:1, measured by axe-core in chromium),
every control is reachable with the Tab key, and the overview works from the keyboard alone."""

from __future__ import annotations

import pytest

from browser_page import chromium_page

ALL_DONE = ("() => { const cards = [...document.querySelectorAll('#cards .dgv-cards .card')]; "
            "return cards.length > 0 && cards.every(c => c.classList.contains('status-done')); }")
# Every control a visitor could use, visible now; each gets an index so that focus can be told apart.
CONTROLS = """() => {
  const all = [...document.querySelectorAll('button, input, textarea, select, a[href], [tabindex]:not([tabindex="-1"])')];
  // Not counted: what is disabled, hidden, or hidden from assistive technology on purpose (Gradio's
  // measuring copy of the tab buttons), and the file input an upload button stands for.
  const usable = all.filter(e => !e.disabled && e.type !== 'file' && e.tabIndex >= 0 && !e.closest('[aria-hidden="true"]')
    && e.checkVisibility({visibilityProperty: true}) && e.getBoundingClientRect().width > 0);
  usable.forEach((e, i) => e.dataset.control = i);
  return usable.map(e => [e.dataset.control, e.tagName, e.id || e.getAttribute('aria-label') || e.innerText.slice(0, 30)]);
}"""


@pytest.fixture(scope="module")
def page(browser, app_server):
    with chromium_page(browser, app_server.url, idle=True) as page:
        page.click("#run")  # the page as it looks with cards, the overview and a focus card on it
        page.wait_for_function(ALL_DONE, timeout=180_000)
        page.click("#cards .dgv-overview canvas", position={"x": 40, "y": 4})
        page.wait_for_selector("#cards .dgv-focus .card")
        yield page


def contrast_failures(page) -> list[str]:
    from axe_playwright_python.sync_playwright import Axe

    result = Axe().run(page, options={"runOnly": {"type": "rule", "values": ["color-contrast"]}})
    return [f"{node['target']}: {node['any'][0]['message']}" for violation in result.response["violations"]
            for node in violation["nodes"]]


def test_every_text_on_the_generate_tab_meets_wcag_aa_contrast(page):
    assert contrast_failures(page) == []


def test_every_text_on_the_lesson_tab_meets_wcag_aa_contrast(page):
    page.get_by_role("tab", name="Tiling vs OOM").click()
    try:
        page.wait_for_selector("#lesson-run", state="visible")
        assert contrast_failures(page) == []
    finally:
        page.get_by_role("tab", name="Generate").click()


def test_every_control_is_reachable_with_the_tab_key(page):
    controls = page.evaluate(CONTROLS)
    assert len(controls) > 20 and any(c[2] == "run" for c in controls) and any(c[2] == "step-slider" or "step" in c[2]
                                                                              for c in controls)
    page.evaluate("() => { document.activeElement?.blur(); window.scrollTo(0, 0); }")
    page.mouse.click(2, 2)  # focus starts at the top of the page
    reached: set[str] = set()
    for _ in range(4 * len(controls)):
        page.keyboard.press("Tab")
        index = page.evaluate("() => document.activeElement?.dataset?.control ?? null")
        if index is not None:
            reached.add(index)
        if len(reached) == len(controls):
            break
    missed = [c for c in controls if c[0] not in reached]
    assert not missed, f"controls Tab never reaches: {missed}"


def test_the_overview_is_usable_from_the_keyboard(page):
    canvas = page.locator("#cards .dgv-overview canvas")
    canvas.focus()
    page.keyboard.press("Escape")  # no request in focus
    assert page.locator("#cards .dgv-focus .card").count() == 0
    page.keyboard.press("Home")
    page.keyboard.press("ArrowDown")  # the second request, its first position
    tip = page.locator("#cards .dgv-tip")
    assert tip.is_visible() and tip.inner_text().startswith("#2 · position 1 · ")
    page.keyboard.press("Enter")
    focused = page.locator("#cards .dgv-focus .card")
    assert focused.get_attribute("data-request") == page.locator("#cards .dgv-cards .card").nth(1).get_attribute("data-request")
    page.locator("#cards .dgv-focus .dgv-close").focus()
    page.keyboard.press("Enter")  # the close button, by keyboard
    assert page.locator("#cards .dgv-focus .card").count() == 0
    assert not page.errors, page.errors
