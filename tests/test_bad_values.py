"""A bad value in any number field or budget box, on the Generate tab and the Tiling-vs-OOM tab, is
answered where the visitor looks (Generate's status line, the lesson's first card) in one sentence:
never Gradio's "Error" badges or toast, and never a traceback in the server's log. A slider takes a
value typed beyond its ends at the nearer end, and the run's line says what it took (a real server, a
real chromium)."""

from __future__ import annotations

import re

import pytest

from browser_page import chromium_page

# Generate's settings by elem_id: a value out of range, and the setting its sentence names.
SETTINGS = {
    "max_new_tokens": "-5", "max_denoising_steps": "-5", "seed": "-1", "t_min": "5", "t_max": "-1",
    "entropy_bound": "-1", "confidence_threshold": "-1", "stability_threshold": "-1", "temperature": "-1",
    "commit_threshold": "2", "editing_threshold": "5", "corrector_steps": "-1", "corrector_k": "-1",
    "corrector_selection_tau": "-1", "memory_budget": "lots",
}  # fmt: skip
# The lesson's boxes: a bad value, and words of the sentence on its first card.
LESSON = [("#lesson-denoising-steps", "-5", "between 1 and 48"), ("#lesson-denoising-steps", "99", "got 99"),
          ("#lesson-budget", "lots", "must be a size")]
BOX = "{0} input:not([type=range]), {0} textarea"


@pytest.fixture(scope="module")
def page(browser, app_server):
    with chromium_page(browser, app_server.url, idle=True) as page:
        yield page


@pytest.fixture
def log(app_server):
    """The server's log from here on: checked for tracebacks when the test ends."""
    start = len(app_server.log())
    yield
    assert "Traceback" not in app_server.log()[start:], app_server.log()[start:]


def no_error_badge(page) -> None:
    assert page.get_by_text("Error", exact=True).count() == 0
    assert page.locator(".toast-body").count() == 0


def one_sentence(text: str) -> bool:
    return bool(re.fullmatch(r"[^\n]+\.", text)) and ". " not in text


def answer(page, selector: str, value: str, button: str, said: str, mark: str) -> str:
    """`value` typed into the box of `selector`, `button` pressed: the new sentence in `said` (after `mark`)."""
    sentence = "([s, m]) => (document.querySelector(s).innerText.split(m)[1] || '').trim()"
    before = page.evaluate(sentence, [said, mark])
    page.fill(BOX.format(selector), value)
    page.click(button)
    page.wait_for_function(f"([s, m, b]) => {{ const now = ({sentence})([s, m]); return now && now !== b; }}",
                           arg=[said, mark, before], timeout=60_000)
    return page.evaluate(sentence, [said, mark])


def test_every_generate_setting_answers_a_bad_value_on_the_status_line(page, log):
    page.get_by_text("Settings (the model's defaults)").click()
    for name, bad in SETTINGS.items():
        selector = f"#setting-{name}"
        good = page.input_value(BOX.format(selector))
        said = answer(page, selector, bad, "#run", "#status", "⚠️ ")
        assert name in said and one_sentence(said), (name, said)
        no_error_badge(page)
        page.fill(BOX.format(selector), good)
    page.get_by_text("Settings (the model's defaults)").click()


def test_the_sliders_take_a_value_beyond_their_ends_at_the_nearer_end(page, log):
    page.fill(BOX.format("#concurrent"), "99")
    page.locator(BOX.format("#concurrent")).press("Enter")
    page.click("#run")
    page.wait_for_function("() => document.querySelectorAll('#cards .card').length === 32", timeout=60_000)  # its most
    page.click("#stop")
    page.wait_for_function("() => document.querySelector('#status').innerText.includes('Run summary')", timeout=120_000)
    for selector, bad, shown in (("#step-slider", "-5", "step 0 of"), ("#step-slider", "999", "(paused)"),
                                 ("#pace", "99", "")):
        page.fill(BOX.format(selector), bad)
        page.locator(BOX.format(selector)).press("Enter")
        page.wait_for_function("s => document.querySelector('#status').innerText.includes(s)", arg=shown or "Replay")
        no_error_badge(page)
    page.fill(BOX.format("#concurrent"), "8")
    page.locator(BOX.format("#concurrent")).press("Enter")
    page.fill(BOX.format("#pace"), "1")
    page.locator(BOX.format("#pace")).press("Enter")


def test_every_lesson_box_answers_a_bad_value_on_its_first_card(page, log):
    page.get_by_role("tab", name="Tiling vs OOM").click()
    budget = page.input_value(BOX.format("#lesson-budget"))
    for selector, bad, words in LESSON:
        said = answer(page, selector, bad, "#lesson-run", "#lesson-untiled", "Untiled (one tile): not run. ")
        assert words in said and one_sentence(said), said
        no_error_badge(page)
        page.fill(BOX.format(selector), {"#lesson-budget": budget}.get(selector, "8"))
    page.fill(BOX.format("#lesson-requests"), "0")  # below the slider's 2: two requests, and their budget
    page.locator(BOX.format("#lesson-requests")).press("Enter")
    page.wait_for_function("b => !document.querySelector('#lesson-budget textarea, #lesson-budget input').value"
                           ".includes(b)", arg=budget, timeout=60_000)
    no_error_badge(page)
    page.get_by_role("tab", name="Generate").click()
