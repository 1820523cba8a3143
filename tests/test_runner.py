"""The runner: a decoder fed soft embeddings equals the model's own forward, and batching is exact."""

from __future__ import annotations

import pytest
import torch

from dgemma.model.loading import load_model
from dgemma.model.runner import Runner


def make_caches(runner: Runner, lengths, seed: int = 1):
    gen = torch.Generator().manual_seed(seed)
    caches = []
    for length in lengths:
        cache = runner.new_cache()
        runner.append_to_cache(cache, torch.randint(3, 40, (length,), generator=gen))
        caches.append(cache)
    return caches


def batch_inputs(runner: Runner, n: int, vocab: int, seed: int = 2):
    gen = torch.Generator().manual_seed(seed)
    canvases = torch.randint(0, vocab, (n, runner.canvas_length), generator=gen)
    prev_logits = torch.randn(n, runner.canvas_length, vocab, generator=gen) * 3
    return canvases, prev_logits


@pytest.fixture(scope="module")
def runner(tiny_model):
    return Runner(tiny_model.model)


@pytest.fixture(scope="module", params=["full", "sliding"])
def any_model(request, tiny_model, tiny_sliding_model_dir):
    """The tiny model, and its twin whose first layer is a sliding window of 8."""
    return tiny_model if request.param == "full" else load_model(tiny_sliding_model_dir, device="cpu")


def test_soft_embedding_decoder_equals_model_forward_given_the_same_logits(runner, tiny_model):
    (cache,) = make_caches(runner, [9])
    canvases, prev_logits = batch_inputs(runner, 1, tiny_model.vocab_size)
    ours = runner.decode(canvases, runner.soft_from_logits(prev_logits), None, [cache])
    with torch.no_grad():
        theirs = tiny_model.model(
            decoder_input_ids=canvases, self_conditioning_logits=prev_logits, past_key_values=cache
        ).logits
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)


def test_first_step_without_self_conditioning_equals_model_forward_with_none(runner, tiny_model):
    (cache,) = make_caches(runner, [5])
    canvases, _ = batch_inputs(runner, 1, tiny_model.vocab_size)
    ours = runner.decode(canvases, None, None, [cache])
    with torch.no_grad():
        theirs = tiny_model.model(decoder_input_ids=canvases, past_key_values=cache).logits
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)


def test_committed_canvas_extends_the_cache_and_positions(runner, tiny_model):
    (cache,) = make_caches(runner, [7])
    runner.append_to_cache(cache, torch.arange(3, 3 + runner.canvas_length))
    assert cache.get_seq_length() == 7 + runner.canvas_length
    canvases, prev_logits = batch_inputs(runner, 1, tiny_model.vocab_size)
    ours = runner.decode(canvases, runner.soft_from_logits(prev_logits), None, [cache])
    with torch.no_grad():
        theirs = tiny_model.model(
            decoder_input_ids=canvases, self_conditioning_logits=prev_logits, past_key_values=cache
        ).logits
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)


def test_batched_decode_of_different_cache_lengths_is_bit_identical_to_solo(any_model):
    model = any_model
    runner = Runner(model.model)
    lengths = [5, 13, 2, 20, 13, 5]  # 13 and 20 exceed the sliding window of 8; equal lengths share a call
    caches = make_caches(runner, lengths)
    canvases, prev_logits = batch_inputs(runner, len(lengths), model.vocab_size)
    soft = runner.soft_from_logits(prev_logits)
    has_soft = torch.tensor([True, False, True, True, False, True])
    batched = runner.decode(canvases, soft, has_soft, caches)
    for b in range(len(lengths)):
        solo = runner.decode(canvases[b : b + 1], soft[b : b + 1], has_soft[b : b + 1], [caches[b]])
        assert torch.equal(batched[b], solo[0]), f"row {b} (cache length {lengths[b]}) differs from its solo run"


def test_model_generate_still_runs_after_the_runner_is_installed(runner, tiny_model):
    ids = torch.tensor([tiny_model.encode("add 1+2")])
    out = tiny_model.model.generate(ids, max_new_tokens=16, max_denoising_steps=2)
    assert out.sequences.shape == (1, ids.shape[1] + 16)


def test_batched_prefill_caches_equal_solo_prefill_and_match_the_plain_encoder(any_model):
    model = any_model
    runner = Runner(model.model)
    prompts = [list(range(3, 3 + n)) for n in (5, 13, 13, 20)]  # 13+ exceed the window of 8
    batched = runner.prefill(prompts)
    for ids, cache in zip(prompts, batched):
        (solo,) = runner.prefill([ids])
        plain = runner.new_cache()
        runner.append_to_cache(plain, torch.tensor(ids))
        assert cache.get_seq_length() == len(ids)
        for mine, alone, ref in zip(cache.layers, solo.layers, plain.layers):
            assert torch.equal(mine.keys, alone.keys) and torch.equal(mine.values, alone.values)
            torch.testing.assert_close(mine.keys, ref.keys, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(mine.values, ref.values, rtol=1e-5, atol=1e-5)
