"""The vocab-chunked step computes what the reference step computes, in a fraction of the memory."""

from __future__ import annotations

import functools

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dgemma.sampling.chunked import MAX_CHUNK, choose_chunk_size, chunked_tile
from dgemma.memory import GiB, VirtualDevice
from dgemma.sampling import LMHead, SamplerConfig, TiledSampler, calibrate_tile, reference_tile
from dgemma.sampling import SamplingParams

HIDDEN = 8


def embed_for(vocab: int) -> torch.Tensor:
    return torch.randn(vocab, HIDDEN, generator=torch.Generator().manual_seed(11)) * HIDDEN**-0.5


def run(impl: str, logits_seq, params, slots, vocab, tiling="off", chunk_size=None, hidden_seq=None, head=None):
    n, CL = len(params), logits_seq[0].shape[1] if logits_seq else hidden_seq[0].shape[1]
    sampler = TiledSampler(SamplerConfig(max(slots) + 1, CL, vocab, embed_for(vocab), 2.0, tiling=tiling, impl=impl,
                                         chunk_size=chunk_size, lm_head=head))  # fmt: skip
    for slot, p in zip(slots, params):
        sampler.start_canvas(slot, p, 0)
    idx = torch.tensor(slots)
    steps = []
    for k in range(len(logits_seq or hidden_seq)):
        if hidden_seq is not None:
            sampler.step(None, slots, hidden=hidden_seq[k])
        else:
            sampler.step(logits_seq[k], slots)
        steps.append({name: getattr(sampler, name)[idx].clone()
                      for name in ("canvas", "draft", "out_accepted", "out_entropy", "soft", "logprobs", "out_converged")})  # fmt: skip
    return steps


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.integers(1, 5),
    canvas_length=st.integers(1, 6),
    vocab=st.integers(2, 1300),
    chunk_size=st.integers(1, 1300),
    tile=st.integers(1, 5),
    seed=st.integers(0, 2**31),
    greedy=st.booleans(),
)
def test_chunked_matches_reference_for_every_chunk_size_and_tile_split(n, canvas_length, vocab, chunk_size, tile, seed, greedy):
    gen = torch.Generator().manual_seed(seed)
    logits_seq = [torch.randn(n, canvas_length, vocab, generator=gen) * 4 for _ in range(2)]
    params = [SamplingParams(seed=seed + i, greedy=greedy, entropy_bound=0.3, max_denoising_steps=2) for i in range(n)]
    slots = list(range(n))
    reference = run("reference", logits_seq, params, slots, vocab)
    chunked = run("chunked", logits_seq, params, slots, vocab, tiling=tile, chunk_size=chunk_size)
    for ref, got in zip(reference, chunked):
        for name in ("canvas", "draft", "out_accepted", "out_converged"):
            assert torch.equal(ref[name], got[name]), name
        torch.testing.assert_close(got["out_entropy"], ref["out_entropy"], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(got["soft"], ref["soft"], rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(got["logprobs"], ref["logprobs"], rtol=1e-5, atol=1e-5)


def test_projection_inside_gives_the_reference_tokens():
    n, CL, V = 4, 8, 3000
    gen = torch.Generator().manual_seed(3)
    head = LMHead(embed_for(V), softcap=30.0)
    hidden_seq = [torch.randn(n, CL, HIDDEN, generator=gen) * 6 for _ in range(3)]
    logits_seq = [head.project(h) for h in hidden_seq]
    params = [SamplingParams(seed=i) for i in range(n)]
    reference = run("reference", logits_seq, params, list(range(n)), V)
    chunked = run("chunked", None, params, list(range(n)), V, chunk_size=512, hidden_seq=hidden_seq, head=head)
    for ref, got in zip(reference, chunked):
        assert torch.equal(ref["canvas"], got["canvas"])
        assert torch.equal(ref["draft"], got["draft"])


def test_chunked_transient_is_a_fraction_of_one_copy_at_real_scale():
    meta_embed = torch.empty(262_144, 2816, dtype=torch.bfloat16, device="meta")
    head = LMHead(meta_embed, 30.0)
    chunked = calibrate_tile(functools.partial(chunked_tile, chunk_size=MAX_CHUNK), 256, 262_144, meta_embed, head)
    assert chunked.copies_per_request <= 0.5  # the projection's output counted in


def test_chunk_size_narrows_as_free_memory_shrinks():
    embed = torch.empty(262_144, 64, device="meta")
    roomy = choose_chunk_size(262_144, 256, 32, 64 * GiB, embed)
    tight = choose_chunk_size(262_144, 256, 32, 1 * GiB, embed)
    assert roomy == MAX_CHUNK
    assert tight < roomy


def test_chunked_untiled_fits_where_reference_untiled_runs_out_of_memory():
    n, CL, V = 6, 16, 8192
    reference_cost = calibrate_tile(reference_tile, CL, V, embed_for(V))
    budget = VirtualDevice(reference_cost.tile_bytes(3))  # room for three reference requests
    params = [SamplingParams(seed=i) for i in range(n)]
    logits = torch.randn(n, CL, V, generator=torch.Generator().manual_seed(0))
    reference = TiledSampler(SamplerConfig(n, CL, V, embed_for(V), 2.0, memory=budget, tiling="off"))
    chunked = TiledSampler(SamplerConfig(n, CL, V, embed_for(V), 2.0, memory=budget, tiling="off", impl="chunked"))
    for sampler in (reference, chunked):
        for i, p in enumerate(params):
            sampler.start_canvas(i, p, 0)
    with pytest.raises(torch.OutOfMemoryError):
        reference.step(logits, list(range(n)))
    plan = chunked.step(logits, list(range(n))).plan
    assert plan.tiles == (n,) and plan.peak_transient_bytes < budget.capacity


def test_unknown_sampler_is_rejected():
    with pytest.raises(ValueError, match="unknown sampler 'fast'"):
        TiledSampler(SamplerConfig(1, 4, 10, torch.zeros(10, 2), 1.0, impl="fast"))


def test_chunked_matches_reference_when_greedy_and_stochastic_rows_share_a_tile():
    n, CL, V = 5, 4, 20_000  # three noise blocks, chunks that cut them
    gen = torch.Generator().manual_seed(5)
    logits_seq = [torch.randn(n, CL, V, generator=gen) * 4 for _ in range(2)]
    params = [SamplingParams(seed=40 + i, greedy=i % 2 == 1, entropy_bound=0.3, max_denoising_steps=2) for i in range(n)]
    reference = run("reference", logits_seq, params, list(range(n)), V)
    chunked = run("chunked", logits_seq, params, list(range(n)), V, tiling=2, chunk_size=3000)
    for ref, got in zip(reference, chunked):
        for name in ("canvas", "draft", "out_accepted", "out_converged"):
            assert torch.equal(ref[name], got[name]), name
