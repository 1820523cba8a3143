"""The page on a classroom projector (1366 x 768): once Run is pressed, the board's overview is on the
first screen; during a run, with the overview scrolled into view, both charts (confidence, and tiles
against free memory) are on screen too (a real server, a real chromium)."""

from __future__ import annotations

import pytest

from browser_page import chromium_page

WIDTH, HEIGHT = 1366, 768
BOXES = {"overview": "#cards .dgv-overview canvas", "confidence": "#entropy-plot", "tiles": "#tile-plot"}
RUNNING = ("() => { const c = document.querySelector('#cards .dgv-overview canvas');"
           " return c && Number(c.dataset.rows) > 0 && /running|step/.test(document.querySelector('#status').innerText); }")


def off_screen(box: dict | None) -> bool:
    """Any part of the box outside the viewport (a pixel's rounding allowed)."""
    return (box is None or box["x"] < -1 or box["y"] < -1 or box["x"] + box["width"] > WIDTH + 1
            or box["y"] + box["height"] > HEIGHT + 1)


@pytest.fixture(scope="module")
def page(browser, app_server):
    with chromium_page(browser, app_server.url, WIDTH, HEIGHT) as page:
        page.wait_for_selector("#run:not([disabled])", timeout=60_000)
        yield page


def test_once_run_is_pressed_the_overview_is_on_the_first_screen(page):
    page.click("#run")  # the example prompts at the model's defaults, as a visitor's first press
    page.wait_for_function("() => Number(document.querySelector('#cards .dgv-overview canvas').dataset.rows) > 0",
                           timeout=120_000)
    try:
        assert page.evaluate("() => window.scrollY") == 0  # nothing scrolled
        box = page.locator(BOXES["overview"]).bounding_box()
        assert not off_screen(box), box
    finally:
        page.wait_for_function("() => document.querySelector('#status').innerText.includes('Run summary')", timeout=120_000)


def test_with_the_overview_scrolled_into_view_during_a_run_both_charts_are_on_screen(page):
    page.get_by_label("Prompts, one per line").fill("count 1 to 12\nreverse hello")
    page.get_by_text("Settings (the model's defaults)").click()
    page.get_by_label("max new tokens").fill("256")
    page.get_by_label("denoising steps").fill("512")
    page.get_by_label("confidence threshold").fill("1e-9")  # nothing converges: the run lasts while we look
    page.get_by_text("Settings (the model's defaults)").click()
    page.click("#run")
    try:
        page.wait_for_function(RUNNING, timeout=120_000)
        page.evaluate(f"() => document.querySelector('{BOXES['overview']}').scrollIntoView()")
        # Two frames drawn since the scroll: the layout the viewer sees, not the one before it.
        page.evaluate("() => new Promise(done => requestAnimationFrame(() => requestAnimationFrame(done)))")
        boxes = {name: page.locator(selector).bounding_box() for name, selector in BOXES.items()}
        assert not [name for name, box in boxes.items() if off_screen(box)], boxes
    finally:
        page.click("#stop")
        page.wait_for_function("() => !/running|step \\d/.test(document.querySelector('#status').innerText)",
                               timeout=120_000)
    assert not page.errors, page.errors
