"""Shared fixtures: tiny random DiffusionGemma checkpoints, saved and loaded back for real.

- `tiny_model_dir`: a 3-layer MoE DiffusionGemma (vocab 64, CL 16) with the project's
  character tokenizer, written with `save_pretrained` to a temp dir (session-scoped);
- `tiny_sliding_model_dir`: the same with a sliding-window first layer (window 8), so caches
  longer than the window are exercised;
- `tiny_model`: `tiny_model_dir` loaded through `dgemma.model.loading.load_model` (session-scoped:
  treat it as read-only);
- `embedded_model`: the shipped model in assets/model, loaded once (skips if it is missing).
Random weights never converge, so tests keep `max_denoising_steps` small.

Tests are marked by kind (pytest.ini lists the markers): `embedded` (uses the shipped model),
`twin` (the released checkpoint's structure twin), `server` (starts a real process), `browser`
(drives chromium), `slow` (all of those). The fast
subset is `python -m pytest -m "not slow"`; the README's test command runs everything.
"""

from __future__ import annotations

import pytest
import torch

import dgemma  # noqa: F401  (first: it asks MKL for strict reproducibility before any product runs)

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


# A module whose every test starts a real process or a browser carries that kind.
KIND_BY_MODULE = {
    "test_app_api": "server",
    "test_app_api_canvas": "server",
    "test_load": "server",
    "test_soak": "server",
    "test_bench_sampler": "server",
    "test_zerogpu": "server",
    "test_startup": "server",
    "test_gpu_check": "server",
    "test_gpu_session": "server",
    "test_browser": "browser",
    "test_browser_canvas": "browser",
    "test_playback": "browser",
    "test_hostile": "browser",
    "test_accessibility": "browser",
    "test_real_scale": "browser",
    "test_upload_progress": "browser",
    "test_lesson_overview": "browser",
    "test_first_tick": "browser",
    "test_slow_visitor": "browser",
    "test_embedded_model": "embedded",
    "test_train": "embedded",
    "test_engine_backend": "embedded",
    "test_bench_lesson": "embedded",
    "test_twin": "twin",
}
SLOW_KINDS = ("embedded", "twin", "server", "browser")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        kind = KIND_BY_MODULE.get(item.module.__name__.rpartition(".")[2])
        if kind:
            item.add_marker(kind)
        if "embedded_model" in getattr(item, "fixturenames", ()):
            item.add_marker("embedded")
        if any(item.get_closest_marker(k) for k in SLOW_KINDS):
            item.add_marker("slow")


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


@pytest.fixture(params=[None, 2], ids=["default-threads", "two-threads"])
def threads(request) -> int:
    """torch's default thread count, or the one given (restored after the test)."""
    before = torch.get_num_threads()
    if request.param is not None:
        torch.set_num_threads(request.param)
    yield torch.get_num_threads()
    torch.set_num_threads(before)
