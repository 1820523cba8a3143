"""Debian's chromium driven by Playwright, for the browser tests (conftest's `browser` fixture launches it)."""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
LAUNCH_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking"]


@contextlib.contextmanager
def launch_chromium() -> Iterator:
    """Headless chromium, closed on exit (the only place the suite launches a browser)."""
    if not Path(CHROMIUM).exists():
        pytest.fail(f"chromium not found at {CHROMIUM}: run scripts/test.sh, which installs it with apt")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=LAUNCH_ARGS)
        try:
            yield browser
        finally:
            browser.close()


IDLE = "() => document.querySelector('#status')?.innerText.includes('Idle.')"


@contextlib.contextmanager
def chromium_page(browser, url: str, width: int = 1360, height: int = 1000, idle: bool = False,
                  prepare: Callable[[Any], None] | None = None) -> Iterator:
    """The app at `url` in a new page of `browser` (the suite's one page opener: test_structure's scan
    holds it); `page.errors` collects the page's uncaught errors. `prepare(page)` runs before the
    page loads (a route to hold a request). `idle`: once the page's first tick has filled in the
    model's defaults and the status line says "Idle." (so the tick cannot overwrite what a test sets)."""
    page = browser.new_page(viewport={"width": width, "height": height})
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    if prepare is not None:
        prepare(page)
    page.goto(url, wait_until="load")
    page.errors = errors
    try:
        if idle:
            page.wait_for_function(IDLE, timeout=60_000)
        yield page
    finally:
        page.close()


def go_to(page, step: int, of: int | None = None, timeout: float = 30_000) -> None:
    """Type `step` into the replay slider's number box, as a user can, and wait until the status line
    shows it ("step k of `of`" when given). A busy page can drop the Enter of a box it is still
    redrawing: it types again, three times in all, then says what the page showed instead."""
    box = page.locator("#step-slider input[type=number]")
    shown = f"step {step} of" + ("" if of is None else f" {of}")
    for attempt in range(3):
        box.fill(str(step))
        box.press("Enter")
        try:
            page.wait_for_function(f"() => /Replay[^]*{shown}/.test(document.querySelector('#status').innerText)",
                                   timeout=timeout)
            return
        except Exception:
            if attempt == 2:
                raise AssertionError(f"step {step} not shown; the status line reads {page.inner_text('#status')!r}") from None


def typed(*entries: tuple[Any, str], settle_ms: int = 500) -> None:
    """Type each (field, text) as a visitor does, until every field holds its text: a field just drawn may
    still be set to its first value by Gradio a moment later, which takes back a keystroke that came first,
    so the test types again, as a person would, until what it typed stays for `settle_ms`."""
    pending = list(entries)
    for _ in range(20):
        for field, text in pending:
            field.fill(text)
        pending[0][0].page.wait_for_timeout(settle_ms)
        pending = [(field, text) for field, text in pending if field.input_value() != text]
        if not pending:
            return
    raise AssertionError(f"the fields never kept {[text for _, text in pending]}")
