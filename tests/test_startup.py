"""Page first: `python app.py` serves its page before torch and the model have loaded.

- the page answers at once, with Run disabled and "Loading model … (n s)" in the status line;
- once the model is ready every page is served ready: the model's line, Run enabled, no timer;
- until the model is ready the API answers "the model is still loading" as one sentence; then it serves;
- a checkpoint that fails to load is one sentence on the page's API and on stderr, and the exit is non-zero;
- nothing before the page imports torch (it takes seconds: the model's thread imports it after).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from gradio_client import Client
from gradio_client.exceptions import AppError

from app_server import MODEL_ARGS, ROOT, launch
from dgemma.app_process import PAGE_LINE, READY_LINE, free_port
from vanishing import wait_until

pytestmark = pytest.mark.server  # each test starts app.py, or the code up to its launch, in a process of its own

LOADING = "The model is still loading; try again when the page says it is ready."


def _component(config: dict, elem_id: str) -> dict:
    return next(c for c in config["components"] if c.get("props", {}).get("elem_id") == elem_id)


def test_the_page_comes_before_the_model(tmp_path):
    server = launch(MODEL_ARGS, tmp_path / "app.log", timeout=120, ready_line=PAGE_LINE)
    try:
        model_was_ready = READY_LINE in server.log()
        config = json.loads(urllib.request.urlopen(f"{server.url}/config", timeout=30).read())
        if model_was_ready or _component(config, "run")["props"]["interactive"]:  # settled (just now, or before)
            assert_served_ready(config)
        else:  # the page was built before the model: Run waits for it
            assert _component(config, "status")["props"]["value"].startswith("Loading model … (")
        client = Client(server.url, verbose=False)
        try:
            client.predict(["add 12+34"], {"seed": 1}, api_name="/generate")
            answered_before_ready = False
        except AppError as err:
            assert str(err) == LOADING
            answered_before_ready = True
        assert answered_before_ready or READY_LINE in server.log()
        wait_until(lambda: READY_LINE in server.log(), bound_s=120, period_s=0.1)
        log = server.log()
        assert log.index(PAGE_LINE) < log.index(READY_LINE)
        assert client.predict(["add 12+34"], {"seed": 1}, api_name="/generate")["outputs"][0]["text"]
        assert_served_ready(json.loads(urllib.request.urlopen(f"{server.url}/config", timeout=30).read()))
    finally:
        server.stop()


def assert_served_ready(config: dict) -> None:
    """A page served once the model is ready is ready in its first paint: the model's line, Run
    enabled, "Idle.", the model's values in the fields, and no loading timer (so no tick is sent)."""
    assert _component(config, "run")["props"]["interactive"] is True
    assert _component(config, "status")["props"]["value"] == "Idle."
    header = next(c for c in config["components"] if c["type"] == "markdown")["props"]["value"]
    assert "parameters" in header and "loading" not in header, header
    assert not [c for c in config["components"] if c["type"] == "timer" and c["props"].get("active")]
    assert _component(config, "lesson-budget")["props"]["value"] != "256MiB"  # the model's own suggestion


# app.main's own path up to the server's launch, which reports whether torch was imported by then.
UP_TO_LAUNCH = """
import sys
import app
def launch(demo, args):
    print("torch before launch:", "torch" in sys.modules, flush=True)
    print("default concurrency:", demo._queue.default_concurrency_limit, flush=True)
    raise SystemExit(0)
app._launch = launch
sys.exit(app.main(sys.argv[1:]))
"""


def test_nothing_before_the_page_imports_torch_and_events_share_the_engine_unlimited():
    result = subprocess.run([sys.executable, "-c", UP_TO_LAUNCH, *MODEL_ARGS], cwd=ROOT, capture_output=True, text=True,
                            timeout=300, env={**os.environ, "GRADIO_ANALYTICS_ENABLED": "False"})  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "torch before launch: False" in result.stdout
    assert "default concurrency: None" in result.stdout  # the engine batches; Gradio's default is 1


@pytest.fixture
def broken_checkpoint(tmp_path) -> Path:
    """The embedded model's config and tokenizer with weights that are not a safetensors file."""
    source = Path(MODEL_ARGS[1]) if MODEL_ARGS else ROOT / "assets" / "model"
    broken = tmp_path / "broken"
    shutil.copytree(source, broken)
    (broken / "model.safetensors").write_bytes(b"not a safetensors file" * 100)
    return broken


def test_a_checkpoint_that_fails_to_load_is_one_sentence_on_the_page_and_stderr(tmp_path, broken_checkpoint):
    port = free_port()
    # The failed app answers for DGEMMA_FAILED_LINGER_S seconds, then exits. The test ends that
    # moment with Ctrl-C once it has read the sentence, so the moment can be longer than any busy
    # machine needs for a few API round trips (6 s was not enough) and costs nothing.
    env = {**os.environ, "GRADIO_ANALYTICS_ENABLED": "False", "NO_PROXY": "127.0.0.1,localhost",
           "DGEMMA_FAILED_LINGER_S": "300"}
    stderr_path = tmp_path / "stderr.log"
    with open(stderr_path, "w") as stderr:
        # Ctrl-C as from a terminal: a process started from a worker of pytest-xdist (or nohup) would
        # inherit SIGINT ignored, and Python then raises no KeyboardInterrupt.
        proc = subprocess.Popen(
            [sys.executable, str(ROOT / "app.py"), "--port", str(port), "--model", str(broken_checkpoint)],
            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=stderr, text=True,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )  # fmt: skip
    try:
        assert PAGE_LINE in proc.stdout.readline()  # the page is served first
        client = Client(f"http://127.0.0.1:{port}", verbose=False)
        messages = []

        def answered_past_loading() -> bool:
            with pytest.raises(AppError) as err:
                client.predict(["add 12+34"], None, api_name="/generate")
            messages.append(str(err.value))
            return messages[-1] != LOADING

        wait_until(answered_past_loading, bound_s=120, period_s=0.2)
        message = messages[-1]
        assert message.startswith("The model failed to load: ") and message.count(". ") == 0, message
        proc.send_signal(signal.SIGINT)  # Ctrl-C: the failure's moment on the page ends, its exit status stays
        assert proc.wait(timeout=120) == 2
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    stderr_text = stderr_path.read_text()
    errors = [line for line in stderr_text.splitlines() if line.startswith("app.py: error:")]
    assert len(errors) == 1 and errors[0].removeprefix("app.py: error: ") in message, stderr_text
    assert "Traceback" not in stderr_text, stderr_text


def test_the_first_tick_writes_no_field_and_sends_the_models_values_for_the_browser_to_fill(tiny_model):
    """Every fresh page gets one loading tick; the visitor may be typing while it is in flight, so it
    writes no field: it sends the model's values, and the browser fills only the fields the visitor
    has not touched (tests/test_first_tick.py types during a tick held in flight)."""

    from dgemma.engine import EngineConfig
    from dgemma.examples import example_sets
    from dgemma.serving.api import model_info
    from dgemma.serving.engine_backend import EngineBackend
    from dgemma.settings import Limits
    from dgemma.ui.generate_tab.controls import PANEL_SETTINGS
    from dgemma.ui.loading_tick import loading_tick as _loading_tick

    backend = EngineBackend(tiny_model, EngineConfig(max_num_seqs=2), Limits(), None)
    try:
        # the panel's settings, from the one table, then the lesson's budget and the prompts
        names = [*(s.name for s in PANEL_SETTINGS), "lesson_budget", "prompts"]
        ids = {name: f"field-{i}" for i, name in enumerate(names)}
        built = {**dict.fromkeys(names), "max_new_tokens": 64, "lesson_budget": "256MiB", "prompts": "example prompt"}
        tick = _loading_tick(backend, False, ids, built)
        status, run, fill, timer = tick["status"], tick["run"], tick["fill"], tick["timer"]
        assert status == "Idle." and run.interactive is True and timer.active is False
        assert fill["ids"] == ids and fill["built"] == built and list(fill["values"]) == names
        shown = fill["values"]
        assert shown["max_new_tokens"] == backend.defaults.max_new_tokens and shown["tiling"] == "auto"
        assert shown["confidence_threshold"] == backend.defaults.params.confidence_threshold
        assert shown["sampler"] == backend.defaults.options.sampler and shown["memory_budget"] == ""
        assert shown["lesson_budget"] == backend.info()["lesson_budget"]
        sets = example_sets(model_info(backend.info(), backend.max_num_seqs)["examples"])
        assert shown["prompts"] == sets[0][0]  # the model's first example prompts
    finally:
        backend.close()


def test_a_field_the_first_tick_fills_has_an_id_on_the_page():
    """Gradio gives an element without an elem_id no id: the browser could not tell it was touched."""
    import gradio as gr

    from dgemma.ui.loading_tick import dom_id

    with gr.Blocks():
        named, unnamed = gr.Number(1, elem_id="setting-x"), gr.Number(2, label="no id")
    assert dom_id(named) == "setting-x"
    with pytest.raises(ValueError, match="needs an elem_id: no id"):
        dom_id(unnamed)
