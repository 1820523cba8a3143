"""The lesson's runs draw the overview of the batch live, in a real chromium on a real server: the
same view as the Generate tab's (one row per request, one cell per canvas position), fed while each
run goes. The run is the lesson's real-scale one (logits padded to vocab 262,144) on the app's model
(the embedded one unless DGEMMA_TEST_MODEL says otherwise), whose tiled run takes about 5 s on a
two-core CPU, in which an idle page drew four of its frames.
"""

from __future__ import annotations

import json

import pytest

from app_server import MODEL_ARGS, ROOT
from browser_page import chromium_page
from test_browser import shots  # noqa: F401  (the screenshots folder fixture)

# 16 requests: at 4, a fast CPU ran the tiled run within one frame period, and the page saw its end only.
REQUESTS, STEPS = 16, 3
FRAME_BYTES = 64 * 1024  # the Generate tab's bound for a real-scale frame on the wire (tests/test_real_scale.py)
# At every change of the lesson's board or its tiled box (a MutationObserver, not a timer: a starved page can draw a
# running frame and the run's end one after the other, within any timer's period): the overview's rows and columns,
# the first card's status, the frames drawn, and whether the page says the tiled run runs.
PROBE = """() => {
  window.__seen = [];
  const board = document.querySelector('#lesson-board'), tiled = document.querySelector('#lesson-tiled');
  const probe = () => {
    const canvas = board.querySelector('.dgv-overview canvas'), card = board.querySelector('.dgv-cards .card');
    const now = {rows: canvas?.dataset.rows, cols: canvas?.dataset.cols, status: card?.className,
                 frames: board.querySelector('.dgv').dataset.frames, tiled: tiled.innerText.includes('running')};
    if (JSON.stringify(now) !== JSON.stringify(window.__seen.at(-1))) window.__seen.push(now);
  };
  for (const box of [board, tiled]) new MutationObserver(probe).observe(box, {subtree: true, childList: true, attributes: true, characterData: true});
  // An error state the next run's first frame replaces is still seen.
  window.__errored = false;
  new MutationObserver(() => { window.__errored ||= !!board.querySelector('.card.status-error'); })
    .observe(board, {subtree: true, childList: true, attributes: true});
}"""


def canvas_length() -> int:
    model = MODEL_ARGS[1] if MODEL_ARGS else ROOT / "assets" / "model"
    return int(json.loads((ROOT / model / "config.json").read_text())["canvas_length"])


@pytest.fixture(scope="module")
def page(browser, app_server):
    with chromium_page(browser, app_server.url, idle=True) as page:
        cdp = page.context.new_cdp_session(page)
        cdp.send("Network.enable")
        urls: dict[str, str] = {}
        page.received = []  # encoded bytes of every chunk of the page's event stream, as test_real_scale counts them
        cdp.on("Network.requestWillBeSent", lambda e: urls.__setitem__(e["requestId"], e["request"]["url"]))
        cdp.on("Network.dataReceived", lambda e: page.received.append(e["encodedDataLength"])
               if "/queue/data" in urls.get(e["requestId"], "") else None)
        yield page


def set_number(page, elem_id: str, value: int) -> None:
    box = page.locator(f"#{elem_id} input[type=number]")
    box.fill(str(value))
    box.press("Enter")


def test_each_lesson_run_draws_the_batch_overview_live_one_row_per_request(page, shots):  # noqa: F811
    page.get_by_role("tab", name="Tiling vs OOM").click()
    set_number(page, "lesson-requests", REQUESTS)
    set_number(page, "lesson-denoising-steps", STEPS)
    page.locator("#lesson-real-scale input").check()
    page.evaluate(PROBE)
    page.received.clear()
    page.click("#lesson-run")
    page.wait_for_selector("#lesson-verdict [data-outcome]", timeout=600_000)
    seen = page.evaluate("() => window.__seen")
    cells = canvas_length()
    # The overview: one row per request, one cell per canvas position, from the first frame on.
    drawn = [s for s in seen if s["rows"] not in (None, "0")]
    assert drawn and all((s["rows"], s["cols"]) == (str(REQUESTS), str(cells)) for s in drawn), drawn[-1:]
    # Live: while the tiled run went (seconds here), the page drew it in progress, its cards still
    # running. How many of its steps the page drew is how fast it draws against how fast the run
    # steps (frames a page has not drawn yet are merged, by design): a busy machine drew one, an
    # idle one four, so no count of them is asserted; across the three runs it drew several frames.
    assert any(s["tiled"] and "status-running" in (s["status"] or "") for s in drawn), drawn[-5:]
    assert len({s["frames"] for s in drawn}) >= 3, sorted({(s["frames"], s["status"]) for s in drawn})
    # The untiled run's out-of-memory ended its cards with the error; at the end every card is done.
    assert any("status-error" in (s["status"] or "") for s in seen) or page.evaluate("() => window.__errored")
    assert page.locator("#lesson-board .dgv-cards .card.status-done").count() == REQUESTS
    assert page.locator("#lesson-board .refine").count() == 0  # Refine is the Generate tab's
    assert "Chunked" in page.inner_text("#lesson-board-title")  # the last run it drew
    assert page.received and max(page.received) <= FRAME_BYTES, max(page.received)  # light on the wire
    page.locator("#lesson-board").screenshot(path=str(shots / "lesson-overview.png"))
    assert not page.errors, page.errors
