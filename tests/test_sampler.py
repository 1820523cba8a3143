"""The sampler: transformers' semantics, keyed randomness, and tiling that changes nothing."""

from __future__ import annotations

import functools

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transformers.models.diffusion_gemma.generation_diffusion_gemma import (
    EntropyBoundSampler,
    EntropyBoundSamplerConfig,
    LinearTemperatureScheduleLogitsProcessor,
    StableAndConfidentStoppingCriteria,
)

from dgemma.memory import Calibration, VirtualDevice
from dgemma.memory.tracker import measure_peak
from dgemma.sampling import LMHead, RowKey, SamplerConfig, Scores, TiledSampler, TileInputs, TileResult, calibrate_tile, chunked_tile, reference_tile
from dgemma.sampling.params import MAX_STABILITY
from dgemma.sampling.primitives import group_bytes_for
from dgemma.sampling.tiled import COMMITTING
from dgemma.sampling import SamplingParams, parse_tiling
from compare_runs import assert_same, logits_for

HIDDEN = 8


def make_sampler(num_slots: int, canvas_length: int, vocab: int, tiling="off", **kwargs) -> TiledSampler:
    embed = torch.randn(vocab, HIDDEN, generator=torch.Generator().manual_seed(7))
    return TiledSampler(SamplerConfig(num_slots, canvas_length, vocab, embed, HIDDEN**0.5, tiling=tiling, **kwargs))


def reference_cost(canvas_length: int, vocab: int) -> Calibration:
    """The reference step's transient at these shapes, as the planner measures it."""
    return calibrate_tile(reference_tile, canvas_length, vocab, torch.empty(vocab, HIDDEN))


def snapshot(sampler: TiledSampler, slots: list[int]) -> dict[str, torch.Tensor]:
    idx = torch.tensor(slots)
    return {
        "canvas": sampler.canvas[idx].clone(),
        "draft": sampler.draft[idx].clone(),
        "soft": sampler.soft[idx].clone(),
        "history": sampler.history[idx].clone(),
        "logprobs": sampler.logprobs[idx].clone(),
        "phase": sampler.phase[idx].clone(),
        "entropy": sampler.out_entropy[idx].clone(),
        "accepted": sampler.out_accepted[idx].clone(),
        "converged": sampler.out_converged[idx].clone(),
    }


def run_steps(sampler, params_list, slots, logits_seq, canvas_index=0):
    for slot, params in zip(slots, params_list):
        sampler.start_canvas(slot, params, canvas_index)
    snaps = []
    for logits in logits_seq:
        sampler.step(logits, slots)
        snaps.append(snapshot(sampler, slots))
    return snaps


# --------------------------------------------------------------------------- transformers semantics


def test_temperature_and_entropy_match_transformers_schedule():
    CL, V, N = 6, 40, 5
    params = SamplingParams(max_denoising_steps=N, t_min=0.3, t_max=0.9, seed=1)
    sampler = make_sampler(1, CL, V)
    sampler.start_canvas(0, params, 0)
    processor = LinearTemperatureScheduleLogitsProcessor(t_min=0.3, t_max=0.9, max_denoising_steps=N)
    for k in range(3):
        logits = logits_for(1, CL, V, seed=k)
        out = sampler.step(logits, [0])
        # transformers counts remaining steps: N, N-1, ...
        processed = processor(None, logits, cur_step=N - k)
        expected = torch.distributions.Categorical(logits=processed).entropy()
        torch.testing.assert_close(out.entropy, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("greedy", [True, False])
def test_entropy_and_draft_logprob_are_fp32_accurate_at_the_released_vocabulary(greedy):
    # torch's softmax (the greedy rows') divides by one fp32 sum over all 262,144 entries, which
    # is off by some parts in 1e5; both kinds of row must be as good as sums per block.
    CL, V = 4, 262144
    logits = logits_for(2, CL, V, seed=5, scale=4.0)
    logits[1] *= 0.05  # a flat row: entropy near log V, where the sum's error shows most
    sampler = make_sampler(2, CL, V)
    for slot in range(2):
        sampler.start_canvas(slot, SamplingParams(greedy=greedy, seed=slot, t_min=1.0, t_max=1.0), 0)
    out = sampler.step(logits, [0, 1])
    logp = torch.log_softmax(logits.double(), dim=-1)
    torch.testing.assert_close(out.entropy.double(), -(logp.exp() * logp).sum(-1), rtol=2e-6, atol=0)
    torch.testing.assert_close(sampler.logprobs[:2].double(), logp.max(-1).values, rtol=2e-6, atol=0)


def test_acceptance_mask_matches_entropy_bound_sampler():
    CL, V = 32, 50
    params = SamplingParams(entropy_bound=0.5, max_denoising_steps=4, t_min=1.0, t_max=1.0)
    sampler = make_sampler(3, CL, V)
    for slot in range(3):
        sampler.start_canvas(slot, params, 0)
    # Peaked rows give a spread of entropies, so the bound cuts somewhere inside the canvas.
    logits = logits_for(3, CL, V, seed=3, scale=1.0) * torch.linspace(0.5, 12, CL)[None, :, None]
    out = sampler.step(logits, [0, 1, 2])
    reference = EntropyBoundSampler(EntropyBoundSamplerConfig(entropy_bound=0.5), CL, V, 4)
    dummy = torch.zeros(3, CL, dtype=torch.long)
    reference.accept_canvas(dummy, dummy, logits, cur_step=4)
    assert torch.equal(out.accepted, reference.accepted_token_mask)
    assert 0 < int(out.accepted.sum()) < 3 * CL


def test_accepted_positions_take_the_sample_and_the_rest_are_renoised():
    CL, V = 64, 30
    sampler = make_sampler(1, CL, V)
    sampler.start_canvas(0, SamplingParams(greedy=True, entropy_bound=0.3, t_min=1.0, t_max=1.0), 0)
    logits = logits_for(1, CL, V, seed=4, scale=1.0) * torch.linspace(0.5, 15, CL)[None, :, None]
    out = sampler.step(logits, [0])
    accepted = out.accepted[0]
    assert torch.equal(out.next_canvas[0][accepted], logits[0].argmax(-1)[accepted])
    # Re-noised positions are uniform draws: they disagree with the argmax far more often than not.
    renoised = ~accepted
    assert (out.next_canvas[0][renoised] != logits[0].argmax(-1)[renoised]).float().mean() > 0.6


@pytest.mark.parametrize("stability_threshold", [0, 1, 2, 3])
def test_stopping_matches_stable_and_confident_criteria(stability_threshold):
    CL, V, N = 8, 20, 12
    params = SamplingParams(max_denoising_steps=N, stability_threshold=stability_threshold, confidence_threshold=0.05)
    sampler = make_sampler(2, CL, V)
    for slot in range(2):
        sampler.start_canvas(slot, params, 0)
    criteria = StableAndConfidentStoppingCriteria(stability_threshold, 0.05)
    processor = LinearTemperatureScheduleLogitsProcessor(params.t_min, params.t_max, N)
    # Row 0: a confident canvas that changes once then holds; row 1: never confident.
    confident_a = torch.full((CL, V), -20.0).scatter_(1, torch.arange(CL)[:, None] % V, 20.0)
    confident_b = torch.full((CL, V), -20.0).scatter_(1, (torch.arange(CL)[:, None] + 1) % V, 20.0)
    flat = torch.zeros(CL, V)
    sequence = [confident_a, confident_b, confident_b, confident_b, confident_b, confident_b]
    for k, row0 in enumerate(sequence):
        logits = torch.stack([row0, flat])
        out = sampler.step(logits, [0, 1])
        processed = processor(None, logits, cur_step=N - k)
        expected = criteria(processed.argmax(-1), processed)
        assert out.converged.tolist() == expected.tolist(), f"step {k}"
        if bool(out.converged[0]):
            break
    assert bool(out.converged[0])


def test_canvas_converges_at_max_steps_even_when_never_confident():
    CL, V, N = 4, 10, 3
    sampler = make_sampler(1, CL, V)
    sampler.start_canvas(0, SamplingParams(max_denoising_steps=N), 0)
    flags = [bool(sampler.step(torch.zeros(1, CL, V), [0]).converged[0]) for _ in range(N)]
    assert flags == [False, False, True]
    assert int(sampler.phase[0]) == COMMITTING


def test_stochastic_sampling_follows_the_tempered_distribution():
    CL, V = 4000, 4
    sampler = make_sampler(1, CL, V)
    sampler.start_canvas(0, SamplingParams(t_min=1.0, t_max=1.0, entropy_bound=1e9, seed=3), 0)
    row = torch.tensor([0.0, 1.0, 2.0, -1.0])
    out = sampler.step(row.expand(1, CL, V).clone(), [0])
    counts = torch.bincount(out.next_canvas[0], minlength=V).float() / CL
    torch.testing.assert_close(counts, row.softmax(-1), atol=0.025, rtol=0)


def test_greedy_takes_the_argmax():
    CL, V = 16, 25
    sampler = make_sampler(1, CL, V)
    sampler.start_canvas(0, SamplingParams(greedy=True, entropy_bound=1e9), 0)
    logits = logits_for(1, CL, V, seed=5)
    out = sampler.step(logits, [0])
    assert torch.equal(out.next_canvas[0], logits[0].argmax(-1))
    assert torch.equal(out.draft[0], logits[0].argmax(-1))


def one_step_tile(
    n: int, CL: int, V: int, greedy: list[bool], with_head: bool, group_bytes: int | None = None, step=reference_tile
) -> TileResult:
    """One step (the reference, unless told) over a tile of fresh canvases, handed logits or hidden states and a head."""
    gen = torch.Generator().manual_seed(11)
    embed = torch.randn(V, HIDDEN, generator=gen)
    hidden = torch.randn(n, CL, HIDDEN, generator=gen) * 4
    head = LMHead(embed, softcap=30.0)
    scores = Scores(hidden=hidden, head=head) if with_head else Scores(logits=head.project(hidden))
    inputs = fresh_canvas_inputs(n, CL, greedy, group_bytes)
    return step(scores, inputs, embed, HIDDEN**0.5)


def fresh_canvas_inputs(n: int, CL: int, greedy: list[bool], group_bytes: int | None = None) -> TileInputs:
    return TileInputs(
        rows=[RowKey(i, 0, 0, greedy[i]) for i in range(n)],
        temperature=torch.linspace(0.5, 1.3, n),
        entropy_bound=torch.full((n,), 2.0),
        confidence_threshold=torch.zeros(n),
        last_step=torch.zeros(n, dtype=torch.bool),
        history=torch.full((n, MAX_STABILITY, CL), -1),
        history_valid=torch.zeros(n, MAX_STABILITY, dtype=torch.bool),
        group_bytes=group_bytes,
    )


@pytest.mark.parametrize("step", [reference_tile, functools.partial(chunked_tile, chunk_size=256)], ids=["reference", "chunked"])
@pytest.mark.parametrize("with_head", [True, False])
@pytest.mark.parametrize("greedy", [[True] * 3, [True, False, True], [False] * 3])
@pytest.mark.parametrize("group_positions", [1, 5])
def test_a_tile_gives_the_same_figures_however_its_positions_are_grouped(step, with_head, greedy, group_positions):
    n, CL, V = 3, 7, 300  # the chunked step's chunks: 256 entries and the short last 44
    whole = one_step_tile(n, CL, V, greedy, with_head, step=step)  # every position at once
    width = V if step is reference_tile else 256
    grouped = one_step_tile(n, CL, V, greedy, with_head, group_positions * width * 4, step)
    for name in TileResult.__dataclass_fields__:
        ours, theirs = getattr(whole, name), getattr(grouped, name)
        assert (ours is None and theirs is None) or torch.equal(ours, theirs), name


@pytest.mark.parametrize("greedy", [True, False])
def test_in_cache_groups_the_weights_take_the_logits_place(greedy):
    # At vocab 262,144 a CPU's cache group is 2 positions of the 32: the weights for the soft
    # embedding (probabilities, or the blocks' exponentials) are written over the logits, one
    # [n, CL, vocab] buffer and a group's scratch where all positions at once hold both.
    n, CL, V = 2, 16, 262_144
    grouped = measure_peak(lambda: one_step_tile(n, CL, V, [greedy] * n, True, group_bytes_for(torch.device("cpu"))))
    whole = measure_peak(lambda: one_step_tile(n, CL, V, [greedy] * n, True))
    assert grouped <= whole - 0.9 * n * CL * V * 4


def test_soft_embedding_is_probs_times_embedding_times_normalizer():
    CL, V = 5, 30
    sampler = make_sampler(1, CL, V)
    params = SamplingParams(t_min=0.5, t_max=0.5)
    sampler.start_canvas(0, params, 0)
    logits = logits_for(1, CL, V, seed=6)
    sampler.step(logits, [0])
    expected = (logits / 0.5).softmax(-1) @ sampler.embed_weight * sampler.normalizer
    torch.testing.assert_close(sampler.soft_embeds([0]), expected, rtol=1e-5, atol=1e-5)


def test_soft_embedding_is_zero_on_a_fresh_canvas():
    sampler = make_sampler(1, 4, 10)
    sampler.start_canvas(0, SamplingParams(), 0)
    sampler.step(logits_for(1, 4, 10, seed=1), [0])
    sampler.start_canvas(0, SamplingParams(), 1)
    assert not sampler.soft_embeds([0]).any()


def test_logprobs_of_the_converged_draft_are_held_for_the_commit():
    CL, V = 4, 12
    sampler = make_sampler(1, CL, V)
    sampler.start_canvas(0, SamplingParams(max_denoising_steps=1, t_min=0.5, t_max=0.5), 0)
    logits = logits_for(1, CL, V, seed=8)
    out = sampler.step(logits, [0])
    assert bool(out.converged[0])
    expected = (logits[0] / 0.5).log_softmax(-1).gather(-1, out.draft[0][:, None]).squeeze(-1)
    torch.testing.assert_close(sampler.take_logprobs(0), expected)


def test_nan_logits_are_flagged_for_that_request_only():
    sampler = make_sampler(2, 4, 10)
    for slot in range(2):
        sampler.start_canvas(slot, SamplingParams(), 0)
    logits = logits_for(2, 4, 10, seed=9)
    logits[1, 2, 3] = float("nan")
    out = sampler.step(logits, [0, 1])
    assert out.finite.tolist() == [True, False]


# --------------------------------------------------------------------------- keyed randomness and tiling

shapes = st.tuples(st.integers(1, 6), st.integers(1, 6), st.integers(2, 40))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    shape=shapes,
    seeds=st.lists(st.integers(0, 2**40), min_size=6, max_size=6),
    greedy=st.lists(st.booleans(), min_size=6, max_size=6),
    tile=st.integers(1, 6),
    extra_slots=st.integers(0, 3),
    data=st.randoms(use_true_random=False),
)
def test_tiled_equals_untiled_bit_for_bit(shape, seeds, greedy, tile, extra_slots, data):
    n, CL, V = shape
    params = [SamplingParams(seed=seeds[i], greedy=greedy[i], max_denoising_steps=3, entropy_bound=0.2) for i in range(n)]
    logits_seq = [logits_for(n, CL, V, seed=k) for k in range(3)]
    untiled = make_sampler(n, CL, V, tiling="off")
    expected = run_steps(untiled, params, list(range(n)), logits_seq)
    # Same requests in other slots of a bigger sampler, tiled: every output row identical,
    # and the slots that are not decoding keep zero outputs across all the tiles.
    tiled = make_sampler(n + extra_slots, CL, V, tiling=tile)
    slots = list(range(extra_slots, extra_slots + n))
    data.shuffle(slots)
    got = run_steps(tiled, params, slots, logits_seq)
    assert_same(expected, got)
    idle = [s for s in range(n + extra_slots) if s not in slots]
    for buffer in (tiled.out_entropy, tiled.out_accepted, tiled.out_mean_entropy, tiled.out_converged):
        assert not buffer[idle].any()


def test_a_seeded_request_gives_the_same_tokens_alone_and_in_a_batch():
    CL, V = 8, 50
    params = SamplingParams(seed=1234, max_denoising_steps=4)
    mine = [logits_for(1, CL, V, seed=k) for k in range(3)]
    alone = run_steps(make_sampler(1, CL, V), [params], [0], mine)
    crowd = make_sampler(5, CL, V, tiling=2)
    others = [SamplingParams(seed=s) for s in (1, 2, 3, 4)]
    batch_logits = [torch.cat([logits_for(4, CL, V, seed=100 + k), m]) for k, m in enumerate(mine)]
    together = run_steps(crowd, others + [params], [0, 1, 2, 4, 3], batch_logits)
    for a, b in zip(alone, together):
        idx = 4  # the request's row in the snapshot: it sits in slot 3, listed last
        assert torch.equal(a["canvas"][0], b["canvas"][idx])
        assert torch.equal(a["draft"][0], b["draft"][idx])


def test_different_seeds_draw_different_canvases():
    sampler = make_sampler(2, 16, 1000)
    sampler.start_canvas(0, SamplingParams(seed=1), 0)
    sampler.start_canvas(1, SamplingParams(seed=2), 0)
    assert not torch.equal(sampler.canvas[0], sampler.canvas[1])


def test_an_injected_oom_is_split_and_retried_with_identical_results():
    n, CL, V = 6, 8, 2000
    params = [SamplingParams(seed=i) for i in range(n)]
    logits_seq = [logits_for(n, CL, V, seed=k) for k in range(2)]
    expected = run_steps(make_sampler(n, CL, V), params, list(range(n)), logits_seq)
    # The planner is told a tile costs almost nothing, so it plans one tile of six; the virtual
    # device (room for about two requests' transient) then raises a real out-of-memory.
    lying = Calibration(bytes_per_request=1, fixed_bytes=0, canvas_length=CL, vocab_size=V)
    room = VirtualDevice(reference_cost(CL, V).tile_bytes(2) + 65536)
    sampler = make_sampler(n, CL, V, tiling="auto", memory=room, calibration=lying)
    got = run_steps(sampler, params, list(range(n)), logits_seq)
    assert_same(expected, got)
    plan = sampler.step(logits_seq[0], list(range(n))).plan
    assert plan.group == n and len(plan.splits) >= 2 and sum(plan.tiles) == n
    assert max(plan.tiles) <= 2


@pytest.mark.parametrize("step", [reference_tile, functools.partial(chunked_tile, chunk_size=1024)], ids=["reference", "chunked"])
@pytest.mark.parametrize("greedy", [True, False], ids=["greedy", "sampled"])
def test_a_requests_soft_embedding_has_the_same_bits_whatever_its_tile_size(step, greedy, threads):
    # A tile of one request multiplies 8 positions' weights by the embedding, a tile of six 48:
    # with two threads MKL's sgemm split the vocabulary's sum between them for the few rows and
    # gave them other last bits (dgemma/reproducible.py).
    n, CL, V = 6, 8, 2000
    params = [SamplingParams(seed=i, greedy=greedy) for i in range(n)]
    logits = logits_for(n, CL, V, seed=0)
    soft = {}
    for size in range(1, n + 1):
        sampler = make_sampler(n, CL, V, tiling=size, tile_fn=step)
        for slot in range(n):
            sampler.start_canvas(slot, params[slot], 0)
        assert sampler.step(logits, list(range(n))).plan.tiles[0] == size
        soft[size] = sampler.soft.clone()
    for size in range(1, n):
        assert torch.equal(soft[size], soft[n]), f"tiles of {size} against one tile of {n}"


def test_untiled_mode_lets_the_out_of_memory_through():
    n, CL, V = 4, 8, 2000
    sampler = make_sampler(n, CL, V, tiling="off", memory=VirtualDevice(reference_cost(CL, V).tile_bytes(2)))
    for i in range(n):
        sampler.start_canvas(i, SamplingParams(seed=i), 0)
    with pytest.raises(torch.OutOfMemoryError, match="out of memory"):
        sampler.step(logits_for(n, CL, V, seed=0), list(range(n)))


def test_auto_tiling_fits_the_step_inside_the_budget():
    n, CL, V = 8, 8, 4000
    cost = reference_cost(CL, V)
    device = VirtualDevice(2 * cost.tile_bytes(3) + cost.bytes_per_request // 2)  # half of it: 3.25 requests
    sampler = make_sampler(n, CL, V, tiling="auto", memory=device)
    for i in range(n):
        sampler.start_canvas(i, SamplingParams(seed=i), 0)
    plan = sampler.step(logits_for(n, CL, V, seed=0), list(range(n))).plan
    assert plan.group == 3 and plan.tiles == (3, 3, 2) and not plan.splits
    assert plan.peak_transient_bytes <= device.capacity


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"max_denoising_steps": 0}, "'max_denoising_steps' must be between 1 and 512"),
        ({"max_denoising_steps": -3}, "'max_denoising_steps' must be between 1 and 512"),
        ({"t_min": 0.8, "t_max": 0.4}, r"'t_max' \(0.4\) must not be below 't_min' \(0.8\)"),
        ({"entropy_bound": 0.0}, "'entropy_bound' must be greater than 0"),
        ({"entropy_bound": -1.0}, "'entropy_bound' must be greater than 0"),
        ({"t_min": float("nan")}, "'t_min' must be a finite number"),
        ({"confidence_threshold": float("inf")}, "'confidence_threshold' must be a finite number"),
        ({"stability_threshold": 99}, "'stability_threshold' must be between 0 and 8"),
        ({"seed": -1}, "'seed' must be between 0 and 9223372036854775807"),
        ({"max_denoising_steps": "many"}, "'max_denoising_steps' must be a number"),
    ],
)
def test_bad_settings_raise_one_clear_line(kwargs, message):
    with pytest.raises(ValueError, match=message) as info:
        SamplingParams(**kwargs)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("kwargs", [{"canvas_length": 0}, {"canvas_length": -4}, {"max_num_seqs": 0}])
def test_bad_sampler_shapes_raise(kwargs):
    args = {"max_num_seqs": 2, "canvas_length": 4, "vocab_size": 10} | kwargs
    with pytest.raises(ValueError, match="must be >= 1"):
        TiledSampler(SamplerConfig(embed_weight=torch.zeros(10, 2), normalizer=1.0, **args))


@pytest.mark.parametrize("value", ["sometimes", "0", -2, True])
def test_bad_tiling_is_rejected(value):
    with pytest.raises(ValueError, match="'tiling' must be auto, off, or a tile size of at least 1"):
        parse_tiling(value)


# --------------------------------------------------------------------------- the noise generator


@settings(max_examples=25, deadline=None)
@given(first=st.integers(0, 5000), count=st.integers(1, 300), keys=st.lists(st.integers(-(2**63), 2**63 - 1), min_size=1, max_size=3))
def test_block_noise_of_a_range_of_blocks_equals_that_slice_of_the_whole_draw(first, count, keys):
    from dgemma.sampling.keyed import keyed_block_gumbel

    keys = torch.tensor(keys)
    whole = keyed_block_gumbel(keys, 3, 0, first + count)
    assert torch.equal(keyed_block_gumbel(keys, 3, first, count), whole[..., first:])


def test_block_noise_is_standard_gumbel_and_keyed():
    from dgemma.sampling.keyed import keyed_block_gumbel

    noise = keyed_block_gumbel(torch.tensor([1, 2]), 64, 0, 20_000)
    assert abs(float(noise.mean()) - 0.5772) < 0.01  # Euler-Mascheroni
    assert abs(float(noise.std()) - torch.pi / 6**0.5) < 0.01
    assert not torch.equal(noise[0], noise[1])
    assert not torch.equal(noise[0, 0], noise[0, 1])
    assert torch.equal(noise, keyed_block_gumbel(torch.tensor([1, 2]), 64, 0, 20_000))


def test_the_block_race_samples_the_softmax_across_blocks():
    from dgemma.sampling.blocks import BLOCK

    CL, V = 4000, 3 * BLOCK + 40  # three full blocks and a short one
    sampler = make_sampler(1, CL, V)
    sampler.start_canvas(0, SamplingParams(t_min=1.0, t_max=1.0, entropy_bound=1e9, seed=5), 0)
    row = torch.full((V,), -30.0)
    likely = torch.tensor([3, BLOCK + 7, BLOCK + 8, 3 * BLOCK + 39])  # in three blocks, the last in the short one
    row[likely] = torch.tensor([1.0, 0.0, 1.5, 0.5])
    out = sampler.step(row.expand(1, CL, V).clone(), [0])
    counts = torch.bincount(out.next_canvas[0], minlength=V)
    assert int(counts[likely].sum()) == CL  # the rest have mass e^-31 each
    torch.testing.assert_close(counts[likely].float() / CL, row.softmax(-1)[likely], atol=0.025, rtol=0)
