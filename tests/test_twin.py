"""The released checkpoint's structure twin: what the embedded model cannot exercise.

`twin_dir` (tests/twin.py) is a random-weight checkpoint with more than 8 experts and top-k 2,
sliding windows shorter than prompt + committed canvases, a wider head on full-attention layers,
proportional RoPE with a partial rotary factor, vocab 262,144 and a chat template. It loads the
way a user loads the release, through `--model DIR`, and the engine must stay exact on it.
"""

from __future__ import annotations

import pytest
import torch

from dgemma.engine import Engine, EngineConfig
from dgemma.model.runner import DENSE_MAX_EXPERTS, Runner
from dgemma.sampling import SamplingParams

STEPS = 2  # random weights never converge: every canvas takes max_denoising_steps
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
    from dgemma.ui.engine_backend import make_backend

    backend = make_backend(app.parse_args(["--model", twin_dir, "--device", "cpu", "--max-num-seqs", "6"]))
    yield backend
    backend.close()


@pytest.fixture(scope="module")
def twin(backend):
    return backend.loaded


def params(seed: int) -> SamplingParams:
    return SamplingParams(max_denoising_steps=STEPS, seed=seed)


def run(twin, prompts, seeds, max_new_tokens=24, **config) -> list[tuple[int, ...]]:
    with Engine(twin, EngineConfig(max_num_seqs=len(prompts), **config)) as eng:
        finals = eng.generate(prompts, [params(s) for s in seeds], max_new_tokens=max_new_tokens)
    assert all(f.status == "done" for f in finals), [f.error for f in finals]
    return [f.token_ids for f in finals]


def test_twin_has_the_released_structure(twin):
    text = twin.model.config.text_config
    assert text.num_experts > DENSE_MAX_EXPERTS and text.top_k_experts >= 2
    assert text.vocab_size == twin.vocab_size == 262_144
    heads = {layer.self_attn.head_dim for layer in twin.model.model.decoder.layers}
    full = twin.model.model.decoder.layers[text.layer_types.index("full_attention")].self_attn
    assert full.head_dim == max(heads) > min(heads)  # the wider head is on full attention
    assert text.rope_parameters["full_attention"]["partial_rotary_factor"] < 1
    assert text.sliding_window < len(twin.encode(PROMPTS[1])) + twin.canvas_length


def test_twin_loads_through_the_model_flag_and_info_describes_it(backend, twin_dir):
    info = backend.info()
    assert info["model"] == twin_dir
    assert (info["vocab_size"], info["canvas_length"], info["max_num_seqs"]) == (262_144, 8, 6)
    assert info["device"] == "cpu" and info["dtype"] == "float32"
    assert info["parameters"] == sum(p.numel() for p in backend.loaded.model.parameters())
    assert info["examples"] and all("\n" not in e and not e.startswith(("add ", "count ")) for e in info["examples"])


def test_chat_template_is_applied_to_prompts(twin):
    ids = twin.encode("What is the sky?")
    text = twin.tokenizer.decode(ids)
    assert text == "<bos><start_of_turn>user\nWhat is the sky?<end_of_turn>\n<start_of_turn>model\n"


def test_seeded_request_gives_the_same_tokens_alone_and_among_6_prompts_of_different_lengths(twin):
    lengths = {len(twin.encode(p)) for p in PROMPTS}
    assert len(lengths) == len(PROMPTS)
    batch = run(twin, PROMPTS, seeds=range(6))
    for i in (1, 4):  # a prompt within the window, and one longer than it
        (alone,) = run(twin, [PROMPTS[i]], seeds=[i])
        assert batch[i] == alone, f"prompt {i} differs between its solo run and the batch"
        assert len(alone) == 24  # three canvases: the windows slid over committed canvases


def test_tiling_off_gives_the_same_tokens_as_auto_and_as_tiles_of_two(twin):
    auto = run(twin, PROMPTS, range(6), max_new_tokens=16, tiling="auto")
    assert run(twin, PROMPTS, range(6), max_new_tokens=16, tiling="off") == auto
    assert run(twin, PROMPTS, range(6), max_new_tokens=16, tiling=2) == auto


def test_chunked_sampler_gives_the_same_tokens_as_the_reference(twin):
    reference = run(twin, PROMPTS[:3], range(3), max_new_tokens=16)
    assert run(twin, PROMPTS[:3], range(3), max_new_tokens=16, sampler="chunked") == reference


def test_runner_decoder_equals_the_models_forward_over_several_committed_canvases(twin):
    runner = Runner(twin.model)
    gen = torch.Generator().manual_seed(3)
    (cache,) = runner.prefill([twin.encode(PROMPTS[2])])
    for _ in range(3):  # commit three canvases: the sliding layers' caches now hold only the window
        runner.encode(cache, torch.randint(0, twin.vocab_size, (twin.canvas_length,), generator=gen))
        canvas = torch.randint(0, twin.vocab_size, (1, twin.canvas_length), generator=gen)
        prev_logits = torch.randn(1, twin.canvas_length, twin.vocab_size, generator=gen) * 3
        ours = runner.decode(canvas, runner.soft_from_logits(prev_logits), None, [cache])
        with torch.no_grad():
            theirs = twin.model(decoder_input_ids=canvas, self_conditioning_logits=prev_logits, past_key_values=cache).logits
        torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-4)
    sliding = cache.layers[0]
    assert cache.get_seq_length() > twin.model.config.text_config.sliding_window > sliding.keys.shape[-2]
