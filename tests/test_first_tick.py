"""The page's first loading tick never overwrites what a visitor typed, even when they type while it
is in flight (a real Gradio server, a real chromium).

A page opened while the model loads gets a tick every 0.5 s; the first after the model is ready
fills in the model's defaults, the lesson's budget and the example prompts. Here the page opens
before the model has loaded (the app's own page-first backend, loaded by the test when it chooses),
and the ticks' requests are held back by the browser until the visitor has typed, as a slow link or
a busy server would hold them: the tick read the fields before the visitor typed, and its answer
arrives after. (A page opened once the model is ready is built ready and gets no tick:
tests/test_startup.py.)
"""

from __future__ import annotations

import json
import time
import urllib.request

import pytest

from browser_page import IDLE, chromium_page, typed
from dgemma.ui.generate_tab.controls import PANEL_SETTINGS

BUILT_BUDGET = "256MiB"  # what a page built before the model loaded shows in the lesson's budget


def tick_fn_index(url: str) -> int:
    """The loading timer's event: a tick of the page's 0.5 s timer."""
    config = json.loads(urllib.request.urlopen(f"{url}/config", timeout=30).read())
    timers = {c["id"] for c in config["components"] if c.get("type") == "timer" and c["props"].get("value") == 0.5}
    return next(d["id"] for d in config["dependencies"] if any(t[0] in timers and t[1] == "tick" for t in d["targets"]))


@pytest.fixture
def loading_app(tiny_model):
    """The page built before the model has loaded, served by Gradio in this process: (its URL, a call
    that loads the model as app.py's loader thread does)."""
    from dgemma.app_process import free_port
    from dgemma.engine import EngineConfig
    from dgemma.serving.engine_backend import EngineBackend
    from dgemma.serving.loading import LoadingBackend
    from dgemma.settings import Limits
    from dgemma.ui.page import build_demo

    backend = LoadingBackend(Limits(), 8, None)
    demo = build_demo(backend)
    demo.launch(server_name="127.0.0.1", server_port=free_port(), prevent_thread_lock=True, quiet=True)
    yield demo.local_url.rstrip("/"), lambda: backend.load(lambda stage: EngineBackend(tiny_model, EngineConfig(max_num_seqs=8), Limits(), None))
    demo.close()
    backend.close()


@pytest.fixture
def page(browser, loading_app):
    url, load_model = loading_app
    tick, held = tick_fn_index(url), []

    def hold_the_tick(route) -> None:
        body = json.loads(route.request.post_data or "{}")
        held.append(route) if body.get("fn_index") == tick else route.continue_()

    with chromium_page(browser, url, prepare=lambda page: page.route("**/queue/join*", hold_the_tick)) as page:
        deadline = time.monotonic() + 60
        while not held and time.monotonic() < deadline:
            page.wait_for_timeout(100)  # the route handler runs while playwright waits
        assert held, "the page sent no loading tick"
        load_model()  # the ticks held in flight will find the model ready
        page.held = held
        yield page


def test_what_a_visitor_types_while_the_first_tick_is_in_flight_stays(page):
    page.wait_for_selector("#run")
    prompts = page.get_by_label("Prompts, one per line")
    typed((prompts, "add 1+2"))
    page.get_by_text("Settings (the model's defaults)").click()
    typed((page.get_by_label("max new tokens"), "7"), (page.get_by_label("t_min"), "0.25"))
    page.get_by_label("t_min").blur()
    assert len(page.held) >= 1  # all the while, the tick is in flight
    for route in page.held:  # the tick, which read the fields before the visitor typed, now answers
        route.continue_()
    page.wait_for_function(IDLE, timeout=30_000)
    page.wait_for_selector("#run:not([disabled])")
    # The tick filled in what the visitor left alone: the lesson's budget becomes the model's suggestion.
    page.get_by_role("tab", name="Tiling vs OOM").click()
    budget = page.locator("#lesson-budget textarea")
    page.wait_for_function(f"() => document.querySelector('#lesson-budget textarea').value !== '{BUILT_BUDGET}'",
                           timeout=60_000)
    page.wait_for_timeout(500)
    page.get_by_role("tab", name="Generate").click()
    assert page.get_by_label("max new tokens").input_value() == "7"
    assert page.get_by_label("t_min").input_value() == "0.25"
    assert prompts.input_value() == "add 1+2"
    assert budget.input_value() and budget.input_value() != BUILT_BUDGET
    assert not page.errors, page.errors


def test_every_field_the_tick_fills_is_found_on_the_page_by_its_id(page):
    """The browser tells a touched field by its element's id: one without an id could be overwritten."""
    page.wait_for_selector("#run")
    page.get_by_text("Settings (the model's defaults)").click()
    ids = ["prompts", *(f"setting-{s.name}" for s in PANEL_SETTINGS)]
    page.wait_for_selector("#setting-max_new_tokens")
    missing = page.evaluate("(ids) => ids.filter((id) => !document.getElementById(id))", ids)
    assert not missing, missing
    for route in page.held:
        route.continue_()
