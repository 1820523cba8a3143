"""The app as a server: `python app.py` on 127.0.0.1, driven through gradio_client.

- the `generate` endpoint gives the same texts, steps and seeds as `python -m dgemma.generate`;
- bad input is one clear sentence (gradio_client's AppError), and the server keeps serving;
- two sessions streaming at once each see only their own requests;
- flags: a bad one is one line and exit 2, before anything loads.
"""

from __future__ import annotations

from dgemma.serving.backend import read_run

import html
import subprocess
import sys
import threading

import pytest
from gradio_client import Client
from gradio_client.exceptions import AppError

from app_server import MODEL_ARGS, ROOT
from conftest import generate_json
from lesson_budget import lesson_budget
from dgemma.ui.generate_tab.controls import client_inputs
from vanishing import BOUND_S, LONG_RUN, stream_then_kill, wait_until

pytestmark = pytest.mark.server  # every test talks to a launched app or runs app.py / the CLI

PROMPTS = ["add 12+34", "reverse hello", "count 5 to 12", "story: big cat, park",
           "sort 3 1 4 1 5", "repeat ab 4", "add 57+68", "story: red fox, river"]  # fmt: skip
SETTINGS = {"seed": 100, "max_new_tokens": 32}


@pytest.fixture(scope="module")
def server(app_server):
    return app_server


@pytest.fixture(scope="module")
def client(server):
    return Client(server.url, verbose=False)


def test_generate_matches_the_cli(client, capsys):
    # The same tokens from two processes: the app's, and this one running the CLI.
    result = client.predict(PROMPTS, SETTINGS, api_name="/generate")
    expected = generate_json(capsys, *MODEL_ARGS, "--seed", str(SETTINGS["seed"]),
                             "--max-new-tokens", str(SETTINGS["max_new_tokens"]),
                             *[arg for p in PROMPTS for arg in ("--prompt", p)])
    assert [o["prompt"] for o in result["outputs"]] == PROMPTS
    for api, ref in zip(result["outputs"], expected, strict=True):
        assert (api["prompt"], api["text"], api["steps"], api["seed"]) == (ref["prompt"], ref["text"], ref["steps"], ref["seed"])
    assert [o["seed"] for o in result["outputs"]] == list(range(100, 108))
    plans = result["tile_plans"]
    assert plans and {"num_decode", "group", "tiles", "free_bytes", "peak_transient_bytes"} <= set(plans[0])


def test_generate_returns_the_run_file_on_request(client):
    from dgemma.recording import load
    from dgemma.ui.board import fold

    result = client.predict(PROMPTS[:3], {**SETTINGS, "record": True}, api_name="/generate")
    recording = load(result["recording"])
    assert recording.header["prompts"] == PROMPTS[:3] and recording.header["seeds"] == [100, 101, 102]
    assert recording.header["model"]["canvas_length"] and recording.steps == len(result["tile_plans"])
    board = fold(recording.events())
    assert [v.committed_text for v in board.requests.values()] == [o["text"] for o in result["outputs"]]
    assert "recording" not in client.predict(PROMPTS[:1], SETTINGS, api_name="/generate")  # only when asked
    with pytest.raises(AppError, match=r"^Setting 'record' must be true or false, got 'yes'\.$"):
        client.predict(PROMPTS[:1], {**SETTINGS, "record": "yes"}, api_name="/generate")


def test_api_page_lists_generate(client):
    api = client.view_api(print_info=False, return_format="dict")["named_endpoints"]
    assert "/generate" in api
    names = [p["parameter_name"] for p in api["/generate"]["parameters"]]
    assert names == ["prompts", "settings"]


BAD = [
    ([], None, "Give at least one prompt."),
    (["x"] * 65, None, "Too many prompts: 65 given, at most 64 per call."),
    (["  "], None, "Prompt 1 is empty"),
    (["x" * 1_000_000], None, "characters long"),
    (["ok"], {"seed": "abc"}, "Setting 'seed' must be a number"),
    (["ok"], {"t_min": "nan"}, "must be a finite number"),
    (["ok"], {"max_new_tokens": -3}, "Setting 'max_new_tokens' must be between 1 and 256"),
    (["ok"], {"t_min": 0.9, "t_max": 0.2}, "must not be below"),
    (["ok"], {"model": "/tmp/evil"}, "Unknown setting 'model'"),
    (["ok"], {"memory_budget": "1KiB"}, "model weights"),
    (["ok"], {"memory_budget": "lots"}, "must be a size"),
    (["ok"], {"sampler": "fast"}, "must be reference or chunked"),
]


@pytest.mark.parametrize("prompts, settings, words", BAD, ids=[w.split()[0] + str(i) for i, (_, _, w) in enumerate(BAD)])
def test_bad_input_is_one_clear_sentence(client, prompts, settings, words):
    with pytest.raises(AppError) as err:
        client.predict(prompts, settings, api_name="/generate")
    message = str(err.value)
    assert words in message, message
    assert "Traceback" not in message and "\n" not in message.strip()


def test_bad_input_leaves_no_traceback_in_the_server_log(server, client):
    # A visitor's mistake is not the server's failure: a log full of them would hide a real one.
    seen = len(server.log())
    for prompts, settings, words in BAD[:3] + BAD[-3:]:
        with pytest.raises(AppError):
            client.predict(prompts, settings, api_name="/generate")
    assert "Traceback" not in server.log()[seen:], server.log()[seen:][-2000:]


def test_a_budget_that_cannot_hold_the_run_gets_the_same_sentence_from_the_api_and_the_cli(client, capsys):
    """Above what the idle engine holds (the weights and its sampler's state), below what the run needs: both
    refuse before anything runs, naming the shortfall and the budget to type, in the same words."""
    from dgemma.generate import main

    prompts = ["count 1 to 5", "add 12+34"]
    with pytest.raises(AppError) as err:
        client.predict(prompts, {"memory_budget": "4700KiB", "max_new_tokens": 16}, api_name="/generate")
    api = str(err.value)
    model = MODEL_ARGS or []
    code = main([*model, *[f for p in prompts for f in ("--prompt", p)], "--memory-budget", "4700KiB",
                 "--max-new-tokens", "16", "--max-num-seqs", "32"])  # app.py's --max-num-seqs, as the server's
    cli = capsys.readouterr().err.strip()
    assert code == 2 and cli.count("\n") == 0, cli
    sentence = cli.removeprefix("python -m dgemma.generate: error: ")
    assert sentence.startswith("The memory budget of 4.6 MiB cannot hold this run: it needs ") and sentence in api, (api, cli)
    assert "the suggested budget for 2 requests is" in sentence


def test_server_still_serves_after_bad_input(client):
    out = client.predict(["reverse abc"], {"seed": 3, "max_new_tokens": 8}, api_name="/generate")
    assert out["outputs"][0]["seed"] == 3


@pytest.mark.parametrize(
    "budget, words",
    [("lots", "must be a size such as 512MiB"), ("1KiB", "cannot even hold the model weights")],
)
def test_lesson_bad_budget_is_one_sentence_on_the_untiled_card(client, budget, words):
    untiled, tiled, chunked, verdict, _chart, _budget, *_board = client.predict(4, budget, False, 2, "entropy_bound", api_name="/lesson")
    assert 'data-outcome="error"' in untiled and words in html.unescape(untiled), untiled
    assert "running" not in untiled + tiled + chunked + verdict  # nothing is left saying it runs


def test_the_lesson_never_runs_a_budget_meant_for_the_other_scale(client, app_model):
    """Run pressed right after ticking real scale: the box still holds the small scale's budget."""
    small, real = (lesson_budget(app_model, 4, scale, max_num_seqs=32) for scale in (False, True))  # app.py's --max-num-seqs
    untiled, tiled, _chunked, verdict, _chart, ran, *_board = client.predict(4, small, True, 2, "entropy_bound", api_name="/lesson")
    assert ran == real != small
    assert 'data-outcome="oom"' in untiled and 'data-outcome="ok"' in tiled, (untiled, tiled)
    assert 'data-outcome="identical"' in verdict, verdict


@pytest.mark.parametrize("scheduler", ["block_refinement", "discrete_ddim"])
def test_the_lesson_runs_with_any_scheduler(client, app_model, scheduler):
    budget = lesson_budget(app_model, 4, max_num_seqs=32)
    untiled, tiled, _chunked, verdict, *_ = client.predict(4, budget, False, 2, scheduler, api_name="/lesson")
    assert 'data-outcome="oom"' in untiled and 'data-outcome="ok"' in tiled, (untiled, tiled)
    assert 'data-outcome="identical"' in verdict, verdict


def test_the_teaching_model_warns_about_a_prompt_outside_its_families(client):
    out = client.predict(["what is 2+2?", "add 12+34"], {"seed": 0, "max_new_tokens": 16}, api_name="/generate")
    outside, inside = out["outputs"]
    assert "only knows its task families" in outside["warning"] and "example prompts" in outside["warning"]
    assert outside["text"] is not None and inside["warning"] == ""  # a note, not a refusal


def test_bad_run_input_is_one_sentence_in_the_status_line(server):
    inputs = client_inputs("add 12+34", 1, max_new_tokens=16, max_denoising_steps=8, t_min=0.9, t_max=0.2)  # t_min > t_max
    frames = list(Client(server.url, verbose=False).submit(*inputs, api_name="/generate_stream"))
    status = frames[-1][3]
    assert "must not be below" in status and "\n" not in status.strip(), status


def test_settings_pick_the_sampler_step_and_tiling(client):
    out = client.predict(["add 12+34", "reverse abc"], {"sampler": "chunked", "tiling": 1, "max_new_tokens": 8},
                         api_name="/generate")
    plans = out["tile_plans"]
    assert plans and all(p["impl"] == "chunked" and max(p["tiles"]) == 1 for p in plans)


def test_info_gives_every_setting_s_default_the_scheduler_among_them(client):
    from dgemma.settings import CANVAS_NAMES, NAMES

    defaults = client.predict(api_name="/info")["defaults"]
    assert set(defaults) == set(NAMES) - set(CANVAS_NAMES)
    assert defaults["scheduler"] == "entropy_bound" and defaults["commit_threshold"] == 0.95
    assert defaults["editing_threshold"] is None and defaults["corrector_steps"] == 0


@pytest.mark.parametrize("scheduler", [{"scheduler": "block_refinement"},
                                       {"scheduler": "discrete_ddim", "corrector_steps": 1}])
def test_a_scheduler_gives_a_request_the_same_tokens_alone_in_a_crowd_tiled_and_untiled(client, scheduler):
    # Alone and untiled at seed 7; then third of four at seed 5 (request i gets 5 + i), one per tile.
    alone = client.predict(["story: red fox, river"], {**scheduler, "seed": 7, "tiling": "off", "max_new_tokens": 32},
                           api_name="/generate")["outputs"][0]
    crowd = client.predict(["add 12+34", "reverse hello", "story: red fox, river", "count 5 to 12"],
                           {**scheduler, "seed": 5, "tiling": 1, "max_new_tokens": 32}, api_name="/generate")
    mate = crowd["outputs"][2]
    assert (mate["seed"], mate["text"], mate["steps"]) == (7, alone["text"], alone["steps"])
    assert crowd["summary"]["scheduler"] == scheduler["scheduler"]
    assert all(max(p["tiles"]) == 1 for p in crowd["tile_plans"])


def _stream(url: str, text: str, n: int, seen: dict, key: str) -> None:
    job = Client(url, verbose=False).submit(
        *client_inputs(text, n, max_new_tokens=16), api_name="/generate_stream"
    )
    frames = list(job)
    seen[key] = frames


def test_two_sessions_see_only_their_own_canvases(server):
    seen: dict[str, list] = {}
    threads = [
        threading.Thread(target=_stream, args=(server.url, "add 11+22", 3, seen, "a")),
        threading.Thread(target=_stream, args=(server.url, "reverse omega", 2, seen, "b")),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    last_a, last_b = seen["a"][-1][0]["rows"], seen["b"][-1][0]["rows"]  # the last compact frame's cards
    assert len(last_a) == 3 and len(last_b) == 2
    assert {r["prompt"] for r in last_a} == {"add 11+22"} and {r["prompt"] for r in last_b} == {"reverse omega"}
    assert all(r["status"] == "done" for r in last_a + last_b)


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


@pytest.mark.parametrize(
    "flags, words",
    [
        (["--port", "99999"], "a port is at most 65535"),
        (["--max-num-seqs", "0"], "at least 1"),
        (["--memory-budget", "lots"], "malformed size"),
        (["--device", "tpu"], "invalid choice"),
    ] + ([] if _has_cuda() else [(["--device", "cuda"], "no CUDA GPU")]),
)
def test_bad_flags_are_one_line(flags, words):
    out = subprocess.run([sys.executable, str(ROOT / "app.py"), *flags], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert words in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr


def test_unknown_model_is_one_line():
    out = subprocess.run([sys.executable, str(ROOT / "app.py"), "--model", "/nonexistent/ckpt", "--port", "1"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert out.stderr.strip().startswith("app.py: error:") and len(out.stderr.strip().splitlines()) == 1, out.stderr


@pytest.mark.parametrize("heartbeat", [True, False], ids=["with-heartbeat", "stream-only"])
def test_a_client_that_vanishes_mid_stream_frees_its_requests_promptly(server, heartbeat):
    """SIGKILL a streaming client's process: its requests, minutes of work, are cancelled within BOUND_S,
    whether the server learns it from Gradio's heartbeat connection (the unload hook) or only from
    the stream's own connection (Gradio closes the generator at its next frame, at most 0.5 s away)."""
    before = server.log().count("client left")
    killed = stream_then_kill(server.url, heartbeat=heartbeat)
    seen = wait_until(lambda: server.log().count("client left") > before, bound_s=60)
    assert seen is not None, server.log()[-2000:]
    print(f"cancelled {seen - killed:.2f} s after the kill")
    assert seen - killed <= BOUND_S, f"cancelled {seen - killed:.2f} s after the kill: {server.log()[-1000:]}"
    assert "cancelled 16 unfinished requests" in server.log().rsplit("client left", 1)[1]


def test_a_vanished_client_whose_run_is_still_queued_is_noticed_too(server, client):
    """Another session's run fills every slot, so this run only waits (no frame changes): the stream
    still hands Gradio a frame every 0.5 s, which is where it finds the client gone."""
    blocker = client.submit(*LONG_RUN[:1], 32, *LONG_RUN[2:], api_name="/generate_stream")  # 32 requests
    try:
        assert wait_until(lambda: len(blocker.outputs()) >= 2, bound_s=120), "the blocking run never started"
        before = server.log().count("client left")
        killed = stream_then_kill(server.url, frames=1, heartbeat=False)  # its first frame: all queued
        seen = wait_until(lambda: server.log().count("client left") > before, bound_s=60)
        assert seen is not None, server.log()[-2000:]
        assert seen - killed <= BOUND_S, f"cancelled {seen - killed:.2f} s after the kill"
        assert "cancelled 16 unfinished requests" in server.log().rsplit("client left", 1)[1]
    finally:
        blocker.cancel()


def test_a_dead_engine_is_restarted_and_the_app_keeps_serving(tiny_model_dir):
    """In-process: crash the engine thread until it gives up; the next run restarts it and completes."""
    import argparse

    from dgemma.serving.engine_backend import make_backend
    from dgemma.sampling import SamplingParams
    from dgemma.settings import RunRequest, Settings
    from faults import install_faults

    args = argparse.Namespace(model=tiny_model_dir, device="cpu", memory_budget=None, max_num_seqs=4,
                              max_prompts=8, max_new_tokens=32, max_queued=8)
    backend = make_backend(args)
    try:
        engine = backend.engine
        faults = install_faults(engine.core)
        faults.crash_steps = engine.config.max_restarts + 2
        first = backend.start(RunRequest(("add 12+34",), Settings(SamplingParams(max_denoising_steps=2), max_new_tokens=16)))
        outputs = read_run(first).outputs()
        first.close()
        # It dies, restarts, dies ... and gives up, each restart a thread its predecessor started.
        wait_until(lambda: not engine.alive, bound_s=30, period_s=0.05)
        assert outputs[0].error and not engine.alive
        faults.crash_steps = 0  # whatever killed it has passed
        second = backend.start(RunRequest(("add 12+34",), Settings(SamplingParams(max_denoising_steps=2), max_new_tokens=16)))
        assert "restarted" in second.notice
        progress = read_run(second)
        outputs, plans = progress.outputs(), progress.plans
        second.close()
        assert not outputs[0].error and plans
    finally:
        backend.close()


RAW = [
    ('{"data": [["add \\ud800 1"], null]}', "not valid Unicode"),  # a lone surrogate, escaped in JSON
    ('{"data": [["add 1+2", " \\n\\t "], null]}', "Prompt 2 is empty"),
    ('{"data": [["ok"], {"t_max": Infinity}]}', "must be a finite number"),
    ('{"data": [["ok"], {"t_min": NaN}]}', "must be a finite number"),
    ('{"data": [["x", "x", "x", "x", "x", "x", "x", "x", "x", "x"], {"seed": -1}]}', "'seed' must be between"),
]


@pytest.mark.parametrize("body, words", RAW, ids=["lone-surrogate", "empty", "infinity", "nan", "negative-seed"])
def test_raw_http_input_a_client_library_would_refuse_is_one_sentence(server, body, words):
    """What gradio_client cannot even encode still reaches the server over plain HTTP: one sentence back."""
    import httpx

    started = httpx.post(f"{server.url}/gradio_api/call/generate", content=body,
                         headers={"content-type": "application/json"}, timeout=30)
    assert started.status_code == 200, started.text
    stream = httpx.get(f"{server.url}/gradio_api/call/generate/{started.json()['event_id']}", timeout=60).text
    assert "event: error" in stream and words in stream, stream
    assert "Traceback" not in stream
