"""The released checkpoint's structure twin: what the embedded model cannot exercise.

`twin_dir` (tests/twin.py) is a config and a tokenizer with more than 8 experts and top-k 2,
sliding windows shorter than prompt + committed canvases, a wider head on full-attention layers,
proportional RoPE with a partial rotary factor, vocab 262,144 and a chat template. It loads the
way a user loads the release's config, `--model DIR --load-format dummy` (random weights built on
the device, nothing else read), and the engine must stay exact on it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from browser_page import chromium_page
from dgemma.engine import Engine, EngineConfig
from dgemma.events import TilePlan
from dgemma.model.runner import DENSE_MAX_EXPERTS, Runner
from dgemma.sampling import SamplingParams

STEPS = 2  # random weights never converge: every canvas takes max_denoising_steps (2: self-conditioning runs)
NEW_TOKENS = 16  # two canvases: the second denoises over a committed one
PROMPTS = [
    "hi",
    "What is the sky?",
    "Why does rain fall? Explain in a short poem about the blue sky.",
    "how do you write?",
    "Can you explain what a poem is, and how to write one about rain in the sky?",
    "a",
]  # fmt: skip


@pytest.fixture(scope="module")
def backend(twin_dir):
    """The app's own start-up path: `app.py --model DIR` flags into make_backend."""
    import app
    from dgemma.serving.engine_backend import make_backend

    backend = make_backend(app.parse_args(["--model", twin_dir, "--load-format", "dummy", "--device", "cpu",
                                                  "--max-num-seqs", "6"]))
    yield backend
    backend.close()


@pytest.fixture(scope="module")
def twin(backend):
    return backend.loaded


def params(seed: int) -> SamplingParams:
    return SamplingParams(max_denoising_steps=STEPS, seed=seed)


def run(twin, prompts, seeds=None, **config) -> tuple[list[tuple[int, ...]], list]:
    """Final token ids of `prompts` (prompt i seeded i unless `seeds` says), and the engine's tile plans."""
    seeds = range(len(prompts)) if seeds is None else seeds
    with Engine(twin, EngineConfig(max_num_seqs=len(PROMPTS), **config)) as eng:
        plans = eng.subscribe()
        finals = eng.run_until_done(prompts, [params(s) for s in seeds], max_new_tokens=NEW_TOKENS)
        seen = [e for e in plans.poll(0.0) if isinstance(e, TilePlan)]
    assert all(f.status == "done" for f in finals), [f.error for f in finals]
    return [f.token_ids for f in finals], seen


@pytest.fixture(scope="module")
def untiled(twin):
    """The six prompts of different lengths in one batch, one sampler tile: the baseline."""
    return run(twin, PROMPTS, tiling="off")[0]


def test_twin_has_the_released_structure(twin):
    text = twin.model.config.text_config
    assert text.num_experts > DENSE_MAX_EXPERTS and text.top_k_experts >= 2
    assert text.vocab_size == twin.vocab_size == 262_144
    heads = {layer.self_attn.head_dim for layer in twin.model.model.decoder.layers}
    full = twin.model.model.decoder.layers[text.layer_types.index("full_attention")].self_attn
    assert full.head_dim == max(heads) > min(heads)  # the wider head is on full attention
    assert text.rope_parameters["full_attention"]["partial_rotary_factor"] < 1
    assert text.sliding_window < len(twin.encode(PROMPTS[1])) + twin.canvas_length


def test_twin_loads_through_the_model_flag_and_info_describes_it_with_chat_examples(backend, twin_dir):
    from dgemma.serving.api import model_info
    from dgemma.examples import CHAT_PROMPTS

    info = model_info(backend.info(), backend.max_num_seqs)
    assert info["model"] == Path(twin_dir).name  # its directory's name, never the server's path
    assert (info["vocab_size"], info["canvas_length"], info["max_num_seqs"]) == (262_144, 8, 6)
    assert info["device"] == "cpu" and info["dtype"] == "float32"
    assert (info["weights"], info["experts"]) == ("random", "per_canvas")  # the CPU default: batch-invariant
    assert "random weights" in backend.info()["note"]  # what the page's header shows under the facts
    assert info["parameters"] == sum(p.numel() for p in backend.loaded.model.parameters())
    assert info["examples"] == CHAT_PROMPTS  # chat questions, not the embedded model's "add 12+34"


def page_at_ready(browser, url: str) -> tuple[str, str]:
    """(header text, prompt box) of a page opened in chromium once Run is enabled."""
    with chromium_page(browser, url) as page:
        page.wait_for_selector("#run:not([disabled])", timeout=180_000)
        page.wait_for_function("() => document.body.innerText.includes('vocab ')", timeout=60_000)
        return page.inner_text("h1 + p, .prose"), page.input_value("textarea")


@pytest.mark.server  # an app of its own, started with DGEMMA_MODEL
def test_app_started_with_dgemma_model_serves_the_twin_and_its_info(twin_dir, browser, tmp_path, monkeypatch):
    from gradio_client import Client

    from dgemma.app_process import launch
    from dgemma.examples import CHAT_PROMPTS

    monkeypatch.setenv("DGEMMA_MODEL", twin_dir)  # no --model flag: the variable chooses
    monkeypatch.setenv("DGEMMA_LOAD_FORMAT", "dummy")
    server = launch(["--device", "cpu", "--max-num-seqs", "4"], tmp_path / "app.log")
    try:
        client = Client(server.url, verbose=False)
        info = client.predict(api_name="/info")
        assert (info["model"], info["vocab_size"], info["canvas_length"]) == (Path(twin_dir).name, 262_144, 8)
        assert info["examples"] == CHAT_PROMPTS
        # The page is served before the model loads; once it has, a page shows the model's header
        # and chat examples (a real browser: the page fills them in from the server at ready).
        header, prompts = page_at_ready(browser, server.url)
        assert "vocab 262,144 · canvas 8 tokens · up to 4 requests at once" in header
        assert prompts.startswith(CHAT_PROMPTS[0]) and "add 12+34" not in prompts
        assert "teaching model knows" not in header  # only the embedded model's header says what it can do
        assert "random weights" in header
        result = client.predict(["Why is the sky blue?", "what is 2+2?"],
                                {"seed": 0, "max_new_tokens": 8, "max_denoising_steps": 1}, api_name="/generate")
        assert result["outputs"][0]["steps"] == 1
        assert [o["warning"] for o in result["outputs"]] == ["", ""]  # a real checkpoint never gets the teaching note
    finally:
        server.stop()


def test_chat_template_is_applied_to_prompts(twin):
    ids = twin.encode("What is the sky?")
    text = twin.tokenizer.decode(ids)
    assert text == "<bos><start_of_turn>user\nWhat is the sky?<end_of_turn>\n<start_of_turn>model\n"


def test_seeded_request_gives_the_same_tokens_alone_and_among_6_prompts_of_different_lengths(twin, untiled):
    assert len({len(twin.encode(p)) for p in PROMPTS}) == len(PROMPTS)
    for i in (0, 4):  # the shortest prompt and the longest
        (alone,), _ = run(twin, [PROMPTS[i]], seeds=[i], tiling="off")
        assert untiled[i] == alone, f"prompt {i} differs between its solo run and the batch"
    assert all(len(tokens) == NEW_TOKENS for tokens in untiled)  # canvases were committed under the windows


def test_tiling_auto_under_a_budget_gives_the_same_tokens_as_tiling_off(twin, untiled):
    from dgemma.model.loading import RESERVED_REQUESTS, sampler_reserve_bytes

    per_request = sampler_reserve_bytes(twin.model.config) // RESERVED_REQUESTS
    budget = twin.weight_bytes + 4 * per_request  # half of what is left: tiles of about 2
    tiled, plans = run(twin, PROMPTS[2:], seeds=range(2, 6), tiling="auto", memory_budget=budget)
    assert tiled == untiled[2:]  # batch-mates never change tokens: compare with the six-prompt batch
    assert max(len(p.tiles) for p in plans) > 1  # auto really tiled


def test_chunked_sampler_gives_the_same_tokens_as_the_reference(twin, untiled):
    chunked, _ = run(twin, PROMPTS[:3], sampler="chunked")
    assert chunked == untiled[:3]


def test_runner_decoder_equals_the_models_forward_over_several_committed_canvases(twin):
    runner = Runner(twin.model)
    gen = torch.Generator().manual_seed(3)
    (cache,) = runner.prefill([twin.encode(PROMPTS[2])])
    for _ in range(3):  # commit three canvases: the sliding layers' caches now hold only the window
        runner.append_to_cache(cache, torch.randint(0, twin.vocab_size, (twin.canvas_length,), generator=gen))
        canvas = torch.randint(0, twin.vocab_size, (1, twin.canvas_length), generator=gen)
        prev_logits = torch.randn(1, twin.canvas_length, twin.vocab_size, generator=gen) * 3
        ours = runner.decode(canvas, runner.soft_from_logits(prev_logits), None, [cache])
        with torch.no_grad():
            theirs = twin.model(decoder_input_ids=canvas, self_conditioning_logits=prev_logits, past_key_values=cache).logits
        torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-4)
    sliding = cache.layers[0]
    assert cache.get_seq_length() > twin.model.config.text_config.sliding_window > sliding.keys.shape[-2]
