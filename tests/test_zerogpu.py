"""ZeroGPU, simulated: `python app.py` with SPACES_ZERO_GPU=1 and the real `spaces` package.

Only what talks to Hugging Face's device API (the scheduler client) and what needs a CUDA device
(a worker's CUDA init and the weights' move) are stubbed, in tests/zerogpu_sim; spaces' own
wrappers fork the worker, pickle every argument and yield, and relay errors as on a Space.

- the app serves, and the generate API gives the texts `python -m dgemma.generate` gives;
- every GPU call asks for the workload size that holds the model (`large` for the embedded one);
- the model ran in another process (spaces' worker), and the main process has no engine thread;
- a quota error from ZeroGPU reaches the API caller as one sentence, and so it does inside Compare;
- closing a stream (a closed page) ends the worker's loop; the worker stays usable;
- a client process killed mid-stream has the worker's loop ended and the GPU released promptly (vanishing.BOUND_S);
- every snapshot the GPU call yields pickles and holds only plain values; Stop ends it;
- no worker process outlives the server.
"""

from __future__ import annotations

from dgemma.serving.backend import read_run
from dgemma.settings import RunRequest

import dataclasses
import os
import pickle
import signal
from pathlib import Path

import pytest
from gradio_client import Client
from gradio_client.exceptions import AppError

from app_server import MODEL_ARGS, launch
from conftest import generate_json
from dgemma.ui.generate_tab.controls import client_inputs
from vanishing import BOUND_S, stream_then_kill, wait_until

pytestmark = pytest.mark.server  # the app as on ZeroGPU: a launched app and its worker processes, and the GPU call in-process

SIM = Path(__file__).resolve().parent / "zerogpu_sim"
PROMPTS = ["add 12+34", "reverse hello", "count 5 to 12", "story: big cat, park"]
SETTINGS = {"seed": 40, "max_new_tokens": 32}
QUOTA = "You have exceeded your free ZeroGPU quota (60s requested vs. 12s left). Try again in 0:04:10."


def _calls(sim_dir: Path) -> list[list[str]]:
    path = sim_dir / "calls.log"
    return [line.split() for line in path.read_text().splitlines()] if path.exists() else []


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return "State:\tZ" not in state  # a zombie has ended


@pytest.fixture(scope="module")
def sim_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("zerogpu")


@pytest.fixture(scope="module")
def server(sim_dir):
    env = {
        "SPACES_ZERO_GPU": "1",
        "SPACES_ZERO_DEVICE_API_URL": "http://127.0.0.1:9",  # never called: the client is stubbed
        "ZEROGPU_OFFLOAD_DIR": str(sim_dir / "tensors"),
        "DGEMMA_SIM_DIR": str(sim_dir),
        # The simulated GPU is this CPU, where bf16 (auto on CUDA) would change the CLI's fp32 texts.
        "DGEMMA_DTYPE": "float32",
        "PYTHONPATH": os.pathsep.join([str(SIM), os.environ.get("PYTHONPATH", "")]),
    }
    server = launch(MODEL_ARGS, sim_dir / "app.log", timeout=180, env=env)
    yield server
    server.stop()
    workers = {int(pid) for name, pid, *_ in _calls(sim_dir) if name == "allow"}
    wait_until(lambda: not any(_alive(pid) for pid in workers), bound_s=60, period_s=0.2)
    assert workers and not [pid for pid in workers if _alive(pid)], "a ZeroGPU worker outlived the server"


@pytest.fixture(scope="module")
def client(server):
    return Client(server.url, verbose=False)


def test_the_app_serves_on_zerogpu(server, client):
    assert "dgemma page at" in server.log()
    assert "/generate" in client.view_api(print_info=False, return_format="dict")["named_endpoints"]


def test_generate_runs_in_a_worker_and_matches_the_cli(server, client, sim_dir, capsys):
    expected = generate_json(capsys, *MODEL_ARGS, "--seed", str(SETTINGS["seed"]),
                             "--max-new-tokens", str(SETTINGS["max_new_tokens"]),
                             *[arg for p in PROMPTS for arg in ("--prompt", p)])
    result = client.predict(PROMPTS, SETTINGS, api_name="/generate")
    got = [(o["prompt"], o["text"], o["steps"], o["seed"]) for o in result["outputs"]]
    assert got == [(r["prompt"], r["text"], r["steps"], r["seed"]) for r in expected]
    workers = {int(pid) for name, pid, *_ in _calls(sim_dir) if name == "allow"}
    assert result["pid"] != server.process.pid and result["pid"] in workers


def test_every_gpu_call_asks_for_the_workload_size_that_holds_the_model(server, client, sim_dir):
    client.predict(PROMPTS[:1], SETTINGS, api_name="/generate")
    sizes = [detail[-1] for name, _pid, *detail in _calls(sim_dir) if name == "schedule"]
    assert sizes and set(sizes) == {"large"}
    assert "ZeroGPU workload size: large" in server.log()


def test_the_main_process_has_no_engine_thread(server, client, sim_dir):
    client.predict(PROMPTS[:1], SETTINGS, api_name="/generate")
    dump = sim_dir / f"threads-{server.process.pid}.txt"
    dump.unlink(missing_ok=True)
    os.kill(server.process.pid, signal.SIGUSR1)
    wait_until(dump.exists, bound_s=60, period_s=0.1)
    names = dump.read_text().split()
    assert "MainThread" in names and "dgemma-engine" not in names


def test_a_quota_error_reaches_the_caller_as_one_sentence(client, sim_dir):
    (sim_dir / "quota").touch()
    try:
        with pytest.raises(AppError) as err:
            client.predict(PROMPTS[:1], SETTINGS, api_name="/generate")
    finally:
        (sim_dir / "quota").unlink()
    assert str(err.value) == QUOTA
    assert client.predict(PROMPTS[:1], SETTINGS, api_name="/generate")["outputs"][0]["text"]  # serves on


def test_a_quota_error_on_a_run_is_one_sentence_in_the_status_line_and_on_its_cards(client, sim_dir):
    inputs = client_inputs("add 12+34", 2, max_new_tokens=16, max_denoising_steps=8)
    (sim_dir / "quota").touch()
    try:
        frames = list(client.submit(*inputs, api_name="/generate_stream"))
    finally:
        (sim_dir / "quota").unlink()
    cards, status = str(frames[-1][0] or ""), frames[-1][3]
    assert QUOTA in status and "\n" not in status.strip(), status
    assert "running" not in cards and "queued" not in cards, cards


def test_a_quota_error_inside_compare_is_one_sentence_above_its_cards(server, browser, sim_dir):
    from browser_page import chromium_page

    with chromium_page(browser, server.url, idle=True) as page:
        page.click("#compare-button")  # the Compare tab
        (sim_dir / "quota").touch()
        try:
            page.click("#compare-run")
            page.wait_for_selector("#compare-table .compare-error", timeout=60_000)
        finally:
            (sim_dir / "quota").unlink()
        said, cards = page.inner_text("#compare-table"), page.inner_text("#compare-cards-a")
        toasts = page.locator(".toast-body").count()
    assert said == f"⚠️ A: {QUOTA}", said  # one sentence, from the side that failed; B never started
    assert "running" not in cards and "queued" not in cards and not toasts, (cards, toasts)
    assert not page.errors, page.errors


def test_closing_a_stream_ends_the_workers_loop(server, client):
    # Stability 8 and a tiny confidence threshold: a canvas takes (nearly) all 32 steps, the run minutes.
    inputs = client_inputs("\n".join(PROMPTS), 8, max_new_tokens=256, max_denoising_steps=32, confidence_threshold=1e-6,
                           stability_threshold=8, seed=7)
    job = client.submit(*inputs, api_name="/generate_stream")
    wait_until(lambda: len(job.outputs()) >= 2, bound_s=120, period_s=0.1)  # streaming from the worker
    assert len(job.outputs()) >= 2
    job.cancel()
    wait_until(lambda: "GPU call closed early" in server.log(), bound_s=60, period_s=0.2)
    assert "GPU call closed early" in server.log()
    assert client.predict(PROMPTS[:1], SETTINGS, api_name="/generate")["outputs"][0]["text"]  # the worker is free


def test_a_client_that_vanishes_mid_stream_frees_the_gpu_promptly(server, sim_dir):
    """SIGKILL a streaming client's process: the worker's loop ends and spaces releases the GPU within BOUND_S."""
    def released() -> int:
        return sum(1 for name, *_ in _calls(sim_dir) if name == "release")

    closed, freed = server.log().count("GPU call closed early"), released()
    killed = stream_then_kill(server.url, frames=3)
    seen = wait_until(lambda: server.log().count("GPU call closed early") > closed and released() > freed, bound_s=60)
    assert seen is not None, server.log()[-2000:]
    print(f"the GPU was released {seen - killed:.2f} s after the kill")
    assert seen - killed <= BOUND_S, f"the GPU was released {seen - killed:.2f} s after the kill"
    assert "client left" in server.log()


# ------------------------------------------------------------ the GPU call itself, in this process


def _plain(value) -> bool:
    if value is None or isinstance(value, (bool, int, float, str)):
        return True
    if isinstance(value, (tuple, list)):
        return all(_plain(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, (str, int)) and _plain(v) for k, v in value.items())
    if dataclasses.is_dataclass(value):
        return all(_plain(getattr(value, f.name)) for f in dataclasses.fields(value))
    return False


@pytest.fixture(scope="module")
def gpu_backend():
    from dgemma.engine import EngineConfig
    from dgemma.model.loading import load_model
    from dgemma.serving import zerogpu as gpu_worker
    from dgemma.serving.zerogpu import ZeroGpuBackend
    from dgemma.settings import Limits

    loaded = load_model(MODEL_ARGS[1] if MODEL_ARGS else None, device="cpu")
    config = EngineConfig(max_num_seqs=8)
    gpu_worker.install(loaded, config)
    return ZeroGpuBackend(loaded, config, Limits(), None)


def test_every_snapshot_pickles_and_is_plain(gpu_backend):
    from dgemma.serving import zerogpu as gpu_worker

    job = gpu_backend._job(RunRequest(tuple(PROMPTS), gpu_backend.defaults))
    snapshots = list(gpu_worker.run_on_gpu(job))
    assert snapshots[-1].done and any(s.events for s in snapshots)
    for snapshot in snapshots:
        assert _plain(snapshot), snapshot
        assert pickle.loads(pickle.dumps(snapshot)) == snapshot


def test_the_lessons_out_of_memory_run_crosses_the_gpu_call_as_plain_snapshots(gpu_backend):
    from dgemma.serving import zerogpu as gpu_worker
    from dgemma.ui.lesson import tab

    call = tab.lesson_call(gpu_backend, 4, 2, None, gpu_backend.suggest_budget(4, False))
    n, job = len(call.prompts), gpu_backend._job(call)
    snapshots = list(gpu_worker.run_on_gpu(job))
    errors = [e for s in snapshots for e in s.events if getattr(e, "status", "") == "error"]
    assert len(errors) == n and all(e.extra["oom"]["needed_bytes"] > e.extra["oom"]["free_bytes"] for e in errors)
    for snapshot in snapshots:
        assert _plain(snapshot) and pickle.loads(pickle.dumps(snapshot)) == snapshot


def test_the_lesson_through_the_gpu_call_runs_out_of_memory_untiled_and_completes_tiled(gpu_backend):
    from dgemma.serving.runs import RunService
    from dgemma.ui.lesson.tab import run_lesson

    runs = {}
    *_, last = run_lesson(RunService(gpu_backend), None, 4, gpu_backend.suggest_budget(4, False), False, 2, runs)
    untiled, tiled = runs["untiled"], runs["tiled"]
    assert not untiled.ok and "OutOfMemoryError" in untiled.message and untiled.needed_bytes > untiled.free_bytes
    assert tiled.ok and len(tiled.tokens) == 4 and 'data-outcome="identical"' in last["verdict"]


def test_stop_closes_the_gpu_call_and_every_card_ends(gpu_backend):
    from dgemma.serving import zerogpu as gpu_worker
    from dgemma.ui.board import Board, apply

    run = gpu_backend.start(RunRequest(tuple(PROMPTS * 2), dataclasses.replace(gpu_backend.defaults, max_new_tokens=256)))
    board = Board()
    for e in run.poll(0.0):
        apply(board, e)
    run.cancel()
    for e in run.poll(0.0):
        apply(board, e)
    assert run.poll(0.0) == []
    assert run._stream.gi_frame is None  # the generator is closed: its loop has ended
    assert board.finished and len(board.requests) == run.size
    assert {v.status for v in board.requests.values()} <= {"done", "cancelled"}
    assert not gpu_worker._driver().has_unfinished()  # the warm worker's engine is left empty


def test_the_deadline_stops_each_unfinished_card_with_one_sentence(gpu_backend, monkeypatch):
    from dgemma.serving import zerogpu as gpu_worker

    monkeypatch.setattr(gpu_worker, "duration", lambda job: 0)  # the GPU time is used up at once
    run = gpu_backend.start(RunRequest(tuple(PROMPTS), dataclasses.replace(gpu_backend.defaults, max_new_tokens=256)), stream=False)
    outputs = read_run(run).outputs()
    assert len(outputs) == len(PROMPTS)
    assert {o.error for o in outputs} == {gpu_worker.TIME_UP}


def test_the_workload_size_is_large_for_a_small_model_and_a_sentence_beyond_xlarge(gpu_backend):
    from dgemma.serving import zerogpu as gpu_worker

    assert gpu_worker.size_for(gpu_backend.loaded) == "large"
    huge = dataclasses.replace(gpu_backend.loaded, weight_bytes=200 * 1024**3)
    with pytest.raises(ValueError, match=r"does not fit a ZeroGPU workload: its weights take 200\.00 GiB"):
        gpu_worker.size_for(huge)


def test_duration_grows_with_the_work_and_is_capped(gpu_backend):
    from dgemma.serving import zerogpu as gpu_worker

    small = gpu_backend._job(RunRequest(("a",), gpu_backend.defaults))
    big = gpu_backend._job(RunRequest(("a",) * 64, dataclasses.replace(gpu_backend.defaults, max_new_tokens=256)))
    huge = dataclasses.replace(big, call=dataclasses.replace(big.call, settings=dataclasses.replace(
        big.call.settings, params=dataclasses.replace(big.call.settings.params, max_denoising_steps=512))))
    assert gpu_worker.duration(small) < gpu_worker.duration(big) <= gpu_worker.MAX_DURATION_S
    assert gpu_worker.duration(huge) == gpu_worker.MAX_DURATION_S


def test_a_budget_below_the_weights_is_refused_in_the_main_process_before_a_gpu_is_asked_for(gpu_backend):
    settings = dataclasses.replace(  # 1 KiB: less than the weights
        gpu_backend.defaults, options=dataclasses.replace(gpu_backend.defaults.options, memory_budget=1024))
    with pytest.raises(ValueError, match="cannot even hold the model weights") as err:
        gpu_backend.start(RunRequest(("add 1+2",), settings))
    assert "\n" not in str(err.value)


def test_a_failure_inside_the_gpu_call_is_one_sentence(gpu_backend, monkeypatch):
    from gradio.exceptions import Error

    from dgemma.serving import zerogpu as gpu_worker

    job = gpu_backend._job(RunRequest(("add 1+2",), gpu_backend.defaults))
    monkeypatch.setattr(gpu_worker, "_config", None)  # a worker whose engine settings never arrived
    with pytest.raises(Error) as err:
        list(gpu_worker.run_on_gpu(job))
    message = err.value.message
    assert message.startswith("The GPU run failed: ") and message.endswith(".") and "\n" not in message
