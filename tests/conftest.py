"""Shared fixtures: tiny random DiffusionGemma checkpoints, saved and loaded back for real.

- `tiny_model_dir`: a 3-layer MoE DiffusionGemma (vocab 64, CL 16) with the project's
  character tokenizer, written with `save_pretrained` to a temp dir (session-scoped);
- `tiny_sliding_model_dir`: the same with a sliding-window first layer (window 8), so caches
  longer than the window are exercised;
- `tiny_model`: `tiny_model_dir` loaded through `dgemma.model.loading.load_model` (session-scoped:
  treat it as read-only);
- `embedded_model`: the shipped model in assets/model, loaded once (skips if it is missing).
Random weights never converge, so tests keep `max_denoising_steps` small.

- `real_scale_run`: a run of the structure twin at the release's view scale (32 x 256, 20 steps),
  recorded once by the CLI for the views' tests (session-scoped, tests/twin.py);
- `app_server`: the launched app every API and browser test shares (session-scoped);
- `browser`: a headless chromium (module-scoped).

Tests are marked by kind (pytest.ini lists the markers) by what they use (KIND_BY_FIXTURE below)
or by an explicit mark: `embedded` (the shipped model), `twin` (the released checkpoint's
structure twin), `server` (starts a real process), `browser` (drives chromium), `slow` (all of
those). The fast tier is `python -m pytest -m "not slow"` (or `bash scripts/test.sh --fast`); the
README's test command runs everything.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import pytest

# Under pytest-xdist (the README's whole-suite command runs two workers) each worker, and every
# process it starts, computes on one thread: two workers with two threads each on two cores spent
# a third more CPU on the same tests (the fast tier: 218 s of CPU against 150 s).
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402  (after the thread count is set)

import dgemma  # noqa: E402, F401  (first: it asks MKL for strict reproducibility before any product runs)

TINY_TEXT = dict(
    vocab_size=64, hidden_size=128, intermediate_size=256, num_hidden_layers=3,
    num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=512,
    sliding_window=512, layer_types=["full_attention"] * 3, pad_token_id=0, eos_token_id=1,
    bos_token_id=2, num_experts=2, top_k_experts=1, moe_intermediate_size=64, global_head_dim=32,
)  # fmt: skip
TINY_VISION = dict(
    model_type="gemma4_vision", hidden_size=16, intermediate_size=32, num_hidden_layers=1,
    num_attention_heads=2, num_key_value_heads=2, head_dim=8,
)  # fmt: skip


# A test's tier comes from what it uses: taking one of these fixtures (itself or through another
# fixture: item.fixturenames is the whole closure) gives it that kind. A test that starts a process
# some other way says so with a mark (`pytestmark = pytest.mark.server` or on the test itself);
# tests/test_suite_marks.py fails when one starts a process, a server or chromium without either.
KIND_BY_FIXTURE = {
    "embedded_model": "embedded",
    "twin_dir": "twin",
    "real_scale_run": "twin",
    "app_server": "server",
    "browser": "browser",
}
SLOW_KINDS = ("embedded", "twin", "server", "browser")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        used = set(getattr(item, "fixturenames", ()))
        for fixture, kind in KIND_BY_FIXTURE.items():
            if fixture in used:
                item.add_marker(kind)
        if any(item.get_closest_marker(k) for k in SLOW_KINDS):
            item.add_marker("slow")
    # Modules that start processes of their own first, then the other slow ones, then the fast:
    # pytest-xdist hands out whole modules in this order (scripts/test.sh: --dist loadfile
    # --no-loadscope-reorder), and a long module handed out last would leave the other worker idle
    # while it runs. Each module's tests stay together and in order.
    server = {item.path for item in items if item.get_closest_marker("server")}
    slow = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: (item.path not in server, item.path not in slow))


def save_tiny_model(path, canvas_length: int = 16, seed: int = 0, **text_overrides) -> str:
    """Build a random tiny DiffusionGemma plus tokenizer and save both to `path`."""
    from transformers import DiffusionGemmaConfig, DiffusionGemmaForBlockDiffusion

    from dgemma.embedded.tokenizer import build_tokenizer

    torch.manual_seed(seed)
    config = DiffusionGemmaConfig(
        text_config={**TINY_TEXT, **text_overrides}, vision_config=TINY_VISION, canvas_length=canvas_length
    )
    DiffusionGemmaForBlockDiffusion(config).save_pretrained(str(path))
    build_tokenizer().save_pretrained(str(path))
    return str(path)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> str:
    return save_tiny_model(tmp_path_factory.mktemp("tiny_model"))


@pytest.fixture(scope="session")
def tiny_sliding_model_dir(tmp_path_factory) -> str:
    return save_tiny_model(
        tmp_path_factory.mktemp("tiny_sliding_model"),
        sliding_window=8,
        layer_types=["sliding_attention", "full_attention", "full_attention"],
    )


@pytest.fixture(scope="session")
def tiny_model(tiny_model_dir):
    from dgemma.model.loading import load_model

    return load_model(tiny_model_dir, device="cpu")


@pytest.fixture(scope="session")
def embedded_model():
    from pathlib import Path

    from dgemma.model.loading import DEFAULT_MODEL, load_model

    if not (Path(DEFAULT_MODEL) / "config.json").is_file():
        pytest.skip("the embedded model is not in assets/model yet")
    return load_model(DEFAULT_MODEL, device="cpu")


@pytest.fixture(scope="session")
def twin_dir(tmp_path_factory) -> str:
    """The released checkpoint's structure twin (tests/twin.py), written with save_pretrained."""
    from twin import save_twin

    return save_twin(tmp_path_factory.mktemp("twin"))


def once_per_run(tmp_path_factory, name: str, make: Callable[[Path], Path]) -> Path:
    """`make(folder)`, done once for the whole run: by this session, or under pytest-xdist by the
    first worker that asks (the others wait on a lock, then take the same file). For results that
    are files; a process (an app server) stays with the worker that started it."""
    from filelock import FileLock

    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the folder every worker's own temporary folder is in
    made = root / f"{name}.path"
    with FileLock(root / f"{name}.lock"):
        if not made.is_file():
            folder = root / name
            folder.mkdir(exist_ok=True)  # a failed make may have left it
            made.write_text(str(make(folder)))
    return Path(made.read_text())


@pytest.fixture(scope="session")
def real_scale_run(tmp_path_factory) -> Path:
    """One recorded run at the release's view scale (tests/twin.py), shared by the views' tests."""
    from twin import record_real_scale_run

    return once_per_run(tmp_path_factory, "real_scale", record_real_scale_run)


class Ran(NamedTuple):
    returncode: int
    stdout: str
    stderr: str


@pytest.fixture
def bench(capsys) -> Callable[..., Ran]:
    """`python -m dgemma.bench ARGS` as its `__main__` runs it (`dgemma.cli.run_cli`), in this process:
    its exit status and what it printed. A fresh interpreter would add seconds of imports to each
    test and check nothing more (tests/test_soak.py starts `python -m dgemma.bench` itself)."""
    from dgemma.bench import main
    from dgemma.cli import run_cli

    def run(*args: str) -> Ran:
        capsys.readouterr()
        with pytest.raises(SystemExit) as exit_:
            run_cli(main, list(args), prog="python -m dgemma.bench")
        out, err = capsys.readouterr()
        return Ran(exit_.value.code, out, err)

    return run


def run_generate_json(capsys, *argv: str) -> tuple[int, list[dict], str]:
    """`python -m dgemma.generate ARGV --json` in this process: its exit code, every line it printed
    (one object per request in input order, then the summary), and its stderr."""
    import json

    from dgemma.generate import main

    capsys.readouterr()
    code = main([*argv, "--json"])
    out, err = capsys.readouterr()
    return code, [json.loads(line) for line in out.splitlines()], err


def generate_json(capsys, *argv: str) -> list[dict]:
    """The requests' objects of `run_generate_json` (the summary left out); fails with its stderr
    when it exits non-zero."""
    code, lines, err = run_generate_json(capsys, *argv)
    assert code == 0, err
    return [row for row in lines if "summary" not in row]


@pytest.fixture(params=[None, 2], ids=["default-threads", "two-threads"])
def threads(request) -> int:
    """torch's default thread count, or the one given (restored after the test)."""
    before = torch.get_num_threads()
    if request.param is not None:
        torch.set_num_threads(request.param)
    yield torch.get_num_threads()
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def app_server(tmp_path_factory):
    """`python app.py` on the embedded model (or $DGEMMA_TEST_MODEL), one for the whole session: every
    test that only talks to the app shares it (tests/app_server.py); a test that needs other flags
    launches its own with `dgemma.app_process.launch` and carries the server mark."""
    from app_server import MODEL_ARGS, shared

    return shared(MODEL_ARGS, tmp_path_factory.mktemp("app"))


@pytest.fixture(scope="session")
def app_model():
    """The model `app_server` serves, loaded here on the CPU: for what a test computes to compare with the app's."""
    from app_server import MODEL_ARGS

    from dgemma.model.loading import load_model

    return load_model(MODEL_ARGS[1] if MODEL_ARGS else None, device="cpu")


@pytest.fixture(scope="module")
def browser():
    """Debian's chromium driven by Playwright, one per module; open pages with browser_page.chromium_page.
    Not one per session: Playwright's sync API keeps its event loop running while it is open, and the
    modules after it that call asyncio.run (test_runfiles, test_compression) then fail."""
    from browser_page import launch_chromium

    with launch_chromium() as chromium:
        yield chromium
