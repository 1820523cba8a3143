"""The page's first canvas in a real browser: click-to-pin, a template, Refine, the run summary,
and two settings side by side.

What the page runs is checked against the API on the same server: the same call gives the same
tokens through the page and the API. Screenshots go to a temporary folder; to refresh the ones
README.md shows, run with DGEMMA_SCREENSHOTS=assets/screenshots.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from gradio_client import Client

from browser_page import chromium_page
from test_browser import shots  # noqa: F401  (the screenshots folder fixture; DGEMMA_SCREENSHOTS)

ALL_DONE = "() => [...document.querySelectorAll('#cards .card')].every(c => c.classList.contains('status-done'))"


def snap(page, shots: Path, name: str, *selectors: str) -> None:
    """A small PNG of the part of the page from the first selector's top to the last's bottom."""
    page.locator(selectors[0]).first.scroll_into_view_if_needed()
    scroll = page.evaluate("() => [window.scrollX, window.scrollY]")  # boxes are the viewport's, the clip the page's
    boxes = [page.locator(s).first.bounding_box() for s in selectors]
    boxes = [{**b, "x": b["x"] + scroll[0], "y": b["y"] + scroll[1]} for b in boxes]
    top, bottom = min(b["y"] for b in boxes), max(b["y"] + b["height"] for b in boxes)
    left, right = min(b["x"] for b in boxes), max(b["x"] + b["width"] for b in boxes)
    page.screenshot(path=str(shots / name), full_page=True,
                    clip={"x": left, "y": top, "width": right - left, "height": bottom - top})


@pytest.fixture(scope="module")
def page(browser, app_server):
    with chromium_page(browser, app_server.url) as page:
        page.wait_for_selector("#run:not([disabled])", timeout=60_000)
        yield page


def run_one(page, prompt: str, seed: int) -> None:
    """Run `prompt` alone, greedy, with `seed`, and wait for its card to finish."""
    page.get_by_label("Prompts, one per line").fill(prompt)
    concurrent = page.locator("input[type=number]").first
    concurrent.fill("1")
    concurrent.press("Enter")
    page.get_by_text("Settings (the model's defaults)").click()
    page.get_by_label("seed (request i gets seed + i)").fill(str(seed))
    page.get_by_label("greedy").check()
    page.get_by_text("Settings (the model's defaults)").click()
    click_and_wait(page, "#run")


def click_and_wait(page, selector: str) -> None:
    """Click, then wait for the new run's cards to finish and its summary (the last run's cards are
    marked first: a redraw replaces them, and the status line keeps the last run's text meanwhile)."""
    page.evaluate("() => document.querySelectorAll('#cards .card').forEach(c => { c.dataset.old = '1'; })")
    page.click(selector)
    page.wait_for_function("() => { const cards = [...document.querySelectorAll('#cards .card')];"
                           " return cards.length && cards.every(c => !c.dataset.old && c.classList.contains('status-done'))"
                           " && document.querySelector('#status').innerText.includes('Run summary'); }", timeout=120_000)


def open_first_canvas(page) -> None:
    """Open the "First canvas" section (closed until opened: the board starts on the first screen)."""
    if not page.locator("#pins textarea").is_visible():
        page.get_by_text("First canvas: start from text").click()


def card_text(page) -> str:
    return page.locator("#cards .card .committed").first.inner_text()


def test_clicking_a_token_pins_it_and_a_template_adds_pins_that_hold(page, app_server, shots):
    run_one(page, "add 12+34", seed=3)
    first = page.locator("#cards .card .ctok[data-pos='0']")
    piece = first.get_attribute("data-piece")
    first.click()  # the First canvas section, closed, opens with the pin in it
    page.wait_for_function("piece => document.querySelector('#pins textarea')?.value === `0=${piece}`", arg=piece)
    page.fill("#template input, #template textarea", "_|9")
    run_one(page, "add 12+34", seed=3)
    text = card_text(page)
    assert text[:2] == f"{piece}9"
    api = Client(app_server.url, verbose=False).predict(
        ["add 12+34"], {"seed": 3, "greedy": True, "pins": {"0": piece, "1": "9"}}, api_name="/generate")
    assert api["outputs"][0]["text"] == text  # the same call through the page and the API
    snap(page, shots, "first-canvas.png", "#start", "#cards")
    summary = page.inner_text("#status")
    assert "tokens per forward" in summary and "tokens/s" in summary and "peak sampler memory" in summary
    page.fill("#pins textarea", "")
    page.fill("#template input, #template textarea", "")
    assert not page.errors, page.errors


def test_refine_runs_the_card_again_from_its_text(page, app_server, shots):
    run_one(page, "count 3 to 9", seed=11)
    refine = page.locator("#cards .card button.refine")
    snap(page, shots, "refine.png", "#status", "#cards .card")
    assert "seed 11" in page.inner_text("#cards .card .card-head") and refine.get_attribute("data-request") == "1"
    # The card names its row; the server reads its first canvas's text: the pieces its tokens show.
    start = page.eval_on_selector_all("#cards .card .ctok", "els => els.map(e => e.dataset.piece).join('')")
    start = start.replace("▁", " ")
    assert start and start == card_text(page)[: len(start)]
    page.get_by_label("Prompts, one per line").fill("")  # Refine runs the card's prompt, not the box's
    click_and_wait(page, "#cards .card button.refine")
    assert page.inner_text("#cards .card .prompt") == "count 3 to 9"
    assert page.locator("#cards .card").count() == 1
    api = Client(app_server.url, verbose=False).predict(
        ["count 3 to 9"], {"seed": 11, "greedy": True, "start": start}, api_name="/generate")
    assert api["outputs"][0]["text"] == card_text(page)
    assert not page.errors, page.errors


def test_a_pin_outside_the_canvas_is_one_sentence_on_the_status_line(page):
    page.get_by_label("Prompts, one per line").fill("add 1+2")
    open_first_canvas(page)
    page.fill("#pins textarea", "99=a")
    page.click("#run")
    page.wait_for_function("() => document.querySelector('#status').innerText.includes('outside the canvas')",
                           timeout=60_000)
    assert page.inner_text("#status") == "⚠️ Pin position 99 is outside the canvas (positions 0 to 15)."
    page.fill("#pins textarea", "")


def test_compare_shows_both_runs_side_by_side_with_their_difference(page, app_server, shots):
    from dgemma.recording import load

    page.get_by_label("Prompts, one per line").fill("add 12+34\nreverse hello")
    concurrent = page.locator("input[type=number]").first
    concurrent.fill("2")
    concurrent.press("Enter")
    page.click("#compare-button")  # the Compare tab: A and B take the Generate tab's prompts and settings
    page.fill("#compare-a textarea, #compare-a input", "greedy=true")
    page.fill("#compare-b textarea, #compare-b input", "greedy=true, sampler=chunked, tiling=off")
    page.click("#compare-run")
    page.wait_for_selector("#compare-table table.compare-table", timeout=180_000)
    for side in ("a", "b"):  # each side in the live view of the Generate tab: an overview row and a card a request
        assert page.locator(f"#compare-cards-{side} .card.status-done").count() == 2
        assert page.locator(f"#compare-cards-{side} .dgv-overview canvas").get_attribute("data-rows") == "2"
        assert page.locator(f"#compare-entropy-{side} .scatterlayer .trace").count() == 2
    snap(page, shots, "compare.png", "#compare")
    table = page.inner_text("#compare-table")
    for label in ("denoising steps", "tokens/s", "tokens per forward", "peak sampler memory"):
        assert label in table, table
    assert "same text in 2 of 2 requests" in table  # the step and the tiling change no token
    with page.expect_download() as download:
        page.click("#compare-download-b")
    recording = load(Path(download.value.path()).read_bytes())
    assert recording.header["settings"]["options"] == {"tiling": "off", "sampler": "chunked", "memory_budget": None,
                                                      "fail_on_oom": False, "pad_vocab": None}
    assert recording.summary["requests"] == 2 and recording.summary["tokens_per_forward"] > 0  # its end line's figures
    texts = [page.locator(f"#compare-cards-a .card .committed").nth(i).inner_text() for i in range(2)]
    seed = int(re.search(r"seed (\d+)", page.locator("#compare-cards-a .card .card-head").first.inner_text())[1])
    api = Client(app_server.url, verbose=False).predict(["add 12+34", "reverse hello"], {"greedy": True, "seed": seed},
                                                    api_name="/generate")
    assert [o["text"] for o in api["outputs"]] == texts
    assert not page.errors, page.errors


def test_a_compare_cards_refine_runs_it_again_in_the_generate_view(page, app_server):
    # After the comparison above: its cards are finished. The card names its row and side (B's
    # first card here, whose run is not the Generate tab's); the server reads its text off that side's run.
    card = page.locator("#compare-cards-b .card").first
    prompt = card.locator(".prompt").inner_text()
    seed = int(re.search(r"seed (\d+)", card.locator(".card-head").inner_text())[1])
    start = card.locator(".ctok").evaluate_all("els => els.map(e => e.dataset.piece).join('')").replace("▁", " ")
    assert start  # its first canvas's tokens, which Refine starts from
    page.click("#generate-button")
    page.get_by_label("Prompts, one per line").fill("")  # Refine runs the card's prompt, not the box's
    page.click("#compare-button")
    click_and_wait(page, "#compare-cards-b .card button.refine >> nth=0")
    assert page.locator("#cards").is_visible()  # the Generate tab shows the run the card's Refine started
    assert page.inner_text("#cards .card .prompt") == prompt
    assert f"seed {seed}" in page.inner_text("#cards .card .card-head")
    api = Client(app_server.url, verbose=False).predict([prompt], {"seed": seed, "greedy": True, "start": start},
                                                    api_name="/generate")
    assert api["outputs"][0]["text"] == card_text(page)
    assert not page.errors, page.errors



COMPARE_LENGTH = 16  # one canvas of the embedded model (its default is four): Compare compares settings, not lengths


def test_compare_takes_two_schedulers_and_lists_the_texts_that_differ(page, app_server, shots):
    from dgemma.recording import load

    prompts = ["story: red girl, garden", "story: small fox, lake", "add 60+20", "reverse nkuds"]
    page.get_by_label("Prompts, one per line").fill("\n".join(prompts))
    concurrent = page.locator("input[type=number]").first
    concurrent.fill("4")
    concurrent.press("Enter")
    page.click("#compare-button")  # the Compare tab
    page.fill("#compare-a textarea, #compare-a input", f"scheduler=entropy_bound, greedy=true, max_new_tokens={COMPARE_LENGTH}")
    page.fill("#compare-b textarea, #compare-b input", f"scheduler=block_refinement, max_new_tokens={COMPARE_LENGTH}")
    page.click("#compare-run")
    page.wait_for_function("() => document.querySelector('#compare-table .compare-same')?.innerText.includes('of 4')",
                           timeout=180_000)
    snap(page, shots, "compare-schedulers.png", "#compare")
    table = page.inner_text("#compare-table")
    assert "scheduler steps" in table and "tokens per forward" in table and "peak sampler memory" in table, table
    texts = {side: [page.locator(f"#compare-cards-{side} .card .committed").nth(i).inner_text() for i in range(4)]
             for side in ("a", "b")}
    differ = [i for i in range(4) if texts["a"][i] != texts["b"][i]]
    assert f"same text in {4 - len(differ)} of 4 requests" in table
    assert page.locator("#compare-table .compare-differ tr").count() == (len(differ) + 1 if differ else 0)
    with page.expect_download() as download:
        page.click("#compare-download-b")
    recording = load(Path(download.value.path()).read_bytes())
    assert recording.header["settings"]["params"]["scheduler"]["name"] == "block_refinement"
    assert recording.summary["scheduler"] == "block_refinement"
    seed = int(re.search(r"seed (\d+)", page.locator("#compare-cards-b .card .card-head").first.inner_text())[1])
    b_settings = {"scheduler": "block_refinement", "seed": seed, "max_new_tokens": COMPARE_LENGTH}
    api = Client(app_server.url, verbose=False).predict(prompts, b_settings, api_name="/generate")
    assert [o["text"] for o in api["outputs"]] == texts["b"]  # B's cards are the API's tokens for its settings
    assert not page.errors, page.errors