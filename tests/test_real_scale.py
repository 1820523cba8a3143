"""The live view at the released model's scale, in a real chromium: 32 requests x 256-token canvases.

The run is made at test time: the structure twin (tests/twin.py) at the release's canvas, 256,
recorded by `python -m dgemma.generate --record` (conftest's `real_scale_run`: 20 denoising steps at
vocab 4,096, shared with tests/test_slow_visitor.py), then loaded into the app's replay. The overview
shows every request and position, each step's frame reaches the page in at most 64 KB on the wire,
and a replay at 0.25 s a step plays its last steps to the end on the local link and on an emulated
4 Mbit/s one. Times (drawing, lateness) are measured by scripts/measure_view.py, not asserted here
(docs/benchmarks.md).
"""

from __future__ import annotations

import pytest

from browser_page import chromium_page, go_to
from test_browser import shots  # noqa: F401  (the screenshots folder fixture)
from twin import REAL_CANVAS as CANVAS
from twin import REAL_REQUESTS as REQUESTS
from twin import REAL_STEPS as STEPS

# The steps whose frames are weighed on the wire: the first, and the last two (at the last, every card
# is finished and carries its Refine mark: the step whose frame once outgrew the bound).
WEIGHED = (1, STEPS - 1, STEPS)
PLAYED = 3  # the replay plays the last steps
FRAME_BYTES = 64 * 1024
SLOW_LINK = {"offline": False, "latency": 40, "downloadThroughput": 4e6 / 8, "uploadThroughput": 2e6 / 8}
FAST_LINK = {"offline": False, "latency": 0, "downloadThroughput": -1, "uploadThroughput": -1}


@pytest.fixture(scope="module")
def page(browser, app_server, real_scale_run):
    with chromium_page(browser, app_server.url, idle=True) as page:
        page.cdp = page.context.new_cdp_session(page)
        page.cdp.send("Network.enable")
        urls: dict[str, str] = {}
        page.received = []  # (encoded bytes, decoded bytes) of every chunk of the page's event stream
        page.cdp.on("Network.requestWillBeSent", lambda e: urls.__setitem__(e["requestId"], e["request"]["url"]))
        page.cdp.on("Network.dataReceived", lambda e: page.received.append((e["encodedDataLength"], e["dataLength"]))
                    if "/queue/data" in urls.get(e["requestId"], "") else None)
        with page.expect_file_chooser() as chooser:
            page.click("#load-run")
        chooser.value.set_files(str(real_scale_run))
        wait_for_step(page, 0)
        yield page


def wait_for_step(page, step: int, timeout: float = 60_000) -> None:
    page.wait_for_function(f"() => /Replay[^]*step {step} of {STEPS}/.test(document.querySelector('#status').innerText)",
                           timeout=timeout)


# At step 0 of the replay: the share of the overview's cell area drawn visibly (darker than 240 of 255),
# and where the confidence chart's y labels, axis title and threshold (label and line) are drawn.
STEP_0 = """() => {
  const c = document.querySelector('#cards .dgv canvas'), dpr = window.devicePixelRatio || 1, gutter = Math.ceil(34 * dpr);
  const px = c.getContext('2d').getImageData(gutter, 0, c.width - gutter, c.height).data;
  let seen = 0;
  for (let i = 0; i < px.length; i += 4) seen += (px[i] + px[i + 1] + px[i + 2]) / 3 < 240;
  const plot = document.querySelector('#entropy-plot .js-plotly-plot'), box = (e) => e.getBoundingClientRect();
  const label = [...plot.querySelectorAll('.annotation')].find((a) => a.textContent.includes('confidence threshold'));
  return {drawn: seen / (px.length / 4), plot: box(plot), title: box(plot.querySelector('.ytitle')),
          ticks: [...plot.querySelectorAll('.ytick text')].map(box), label: label && box(label),
          line: box(plot.querySelector('.shapelayer path'))};
}"""


def test_step_0_shows_the_random_start_with_every_chart_label_in_its_place(page, shots):  # noqa: F811
    """The overview shows step 0's random canvases as the cards do (not a blank board), and the
    confidence chart's y labels stay inside the chart, clear of its axis title, with the threshold's
    label on its line (docs/benchmarks.md shows this screenshot)."""
    go_to(page, 0, of=STEPS, timeout=60_000)
    page.wait_for_function("""() => { const plot = document.querySelector('#entropy-plot .js-plotly-plot');  // drawn after the status line
      return plot && plot.querySelector('.shapelayer path') && plot.querySelector('.ytick text') &&
        [...plot.querySelectorAll('.annotation')].some((a) => a.textContent.includes('confidence threshold')); }""",
                           timeout=60_000)
    seen = page.evaluate(STEP_0)
    assert seen["drawn"] > 0.5, seen["drawn"]
    assert seen["ticks"] and all(seen["plot"]["left"] <= t["left"] and seen["title"]["right"] <= t["left"] + 1
                                 for t in seen["ticks"]), seen
    assert seen["label"], "the threshold's label is not drawn"
    line_y = seen["line"]["top"] + seen["line"]["height"] / 2
    assert abs(seen["label"]["bottom"] - line_y) < 8 and seen["label"]["top"] >= seen["plot"]["top"], seen
    page.locator("#live-views").screenshot(path=str(shots / "replay-step-0.png"))  # the board and both charts


def test_the_overview_shows_every_request_and_every_position(page, shots):  # noqa: F811
    rows = page.evaluate("() => document.querySelector('#cards .dgv canvas').height / (window.devicePixelRatio || 1)")
    assert page.locator("#cards .dgv-cards .card").count() == REQUESTS and rows >= REQUESTS * 3
    cards = page.locator("#cards .dgv-cards .card .canvas").first
    assert 0 < cards.locator(".tok").count() < CANVAS  # clipped, with a way to see all
    page.locator("#cards .dgv-more").first.click()
    assert page.locator("#cards .dgv-cards .card .canvas").first.locator(".tok").count() == CANVAS
    page.locator("#cards .dgv-more").first.click()
    go_to(page, 2, of=STEPS, timeout=60_000)
    page.click("#cards .dgv-overview canvas", position={"x": 200, "y": 30})  # a request in full in the focus card
    assert page.locator("#cards .dgv-focus .card .canvas .tok").count() == CANVAS
    page.locator("#cards .dgv-overview").scroll_into_view_if_needed()
    page.mouse.move(page.locator("#cards .dgv-overview canvas").bounding_box()["x"] + 300,
                    page.locator("#cards .dgv-overview canvas").bounding_box()["y"] + 100)  # a token on hover
    assert page.locator("#cards .dgv-tip").is_visible() and " · position " in page.inner_text("#cards .dgv-tip")
    page.screenshot(path=str(shots / "overview-real-scale.png"))


def test_each_real_scale_frame_is_at_most_64_kb_on_the_wire(page):
    sizes = []
    for step in WEIGHED:
        before = len(page.received)
        frames = int(page.evaluate("() => document.querySelector('#cards .dgv').dataset.frames"))
        go_to(page, step, of=STEPS, timeout=60_000)
        page.wait_for_function(f"() => +document.querySelector('#cards .dgv').dataset.frames > {frames}")
        # The rest of the step's messages: both charts, drawn once they have come, marking this step.
        page.wait_for_function(f"""() => [['#entropy-plot', 'step {step}'], ['#tile-plot', 'call {step}']].every(([id, text]) =>
            (document.querySelector(id + ' .js-plotly-plot')?.layout?.annotations || []).some(a => a.text === text))""",
                               timeout=30_000)
        # The stream is flushed message by message, so the step's charts come in chunks of their
        # own: the largest chunk is the frame's, or a chart's (`python -m dgemma.bench frames`
        # prints each frame's own bytes).
        chunks = page.received[before:]
        sizes.append((max(c[0] for c in chunks), sum(c[0] for c in chunks), sum(c[1] for c in chunks)))
    assert all(largest <= FRAME_BYTES for largest, _, _ in sizes), sizes
    # The event stream is compressed: judged on the step's totals, since a loaded machine's reads
    # split the compressed and the decoded bytes at different chunk boundaries.
    assert all(decoded > 2 * wire for _, wire, decoded in sizes), sizes


@pytest.mark.parametrize("link", ["local", "4 Mbit/s down, 2 up, 40 ms"])
def test_a_quarter_second_replay_plays_to_the_last_step_and_stops_there(page, link):
    """How late the last step comes is measured by scripts/measure_view.py (docs/benchmarks.md)."""
    pace = page.locator("#pace input[type=number]")
    pace.fill("0.25")
    pace.press("Enter")
    go_to(page, STEPS - PLAYED, of=STEPS, timeout=60_000)  # on the local link: what is timed on the emulated one is the play
    page.cdp.send("Network.emulateNetworkConditions", SLOW_LINK if link != "local" else FAST_LINK)
    try:
        page.click("#play")
        wait_for_step(page, STEPS, timeout=30_000)
        page.wait_for_function("() => document.querySelector('#status').innerText.includes('(paused)')", timeout=30_000)
        assert page.locator("#cards .dgv-cards .card.status-done").count() == REQUESTS  # the last step: every text final
    finally:
        page.cdp.send("Network.emulateNetworkConditions", FAST_LINK)
    assert not page.errors, page.errors
