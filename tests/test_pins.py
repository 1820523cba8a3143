"""Pinned tokens and starting canvases in the sampler: pins hold, and tiling, the step and batch-mates
still change no token (the properties of tests/test_sampler.py and tests/test_chunked.py, with pins
and starts)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dgemma.sampling import SamplerConfig, SamplingParams, TiledSampler
from dgemma.sampling.start import CanvasStart, resolve_start
from compare_runs import assert_same, logits_for

HIDDEN = 8
STEPS = 3


def canvas_starts(canvas_length: int, vocab: int) -> st.SearchStrategy[CanvasStart]:
    """No start, a start, pins, or both (positions inside the canvas, tokens of the vocabulary)."""
    tokens = st.lists(st.integers(0, vocab - 1), max_size=canvas_length).map(tuple)
    pins = st.dictionaries(st.integers(0, canvas_length - 1), st.integers(0, vocab - 1), max_size=canvas_length)
    return st.builds(lambda t, p: CanvasStart(t, tuple(sorted(p.items()))), tokens, pins)


def run(starts: list[CanvasStart], params: list[SamplingParams], slots: list[int], logits_seq, impl="reference",
        tiling="off", extra_slots=0, chunk_size=None) -> list[dict[str, torch.Tensor]]:
    vocab, canvas_length = logits_seq[0].shape[2], logits_seq[0].shape[1]
    embed = torch.randn(vocab, HIDDEN, generator=torch.Generator().manual_seed(7))
    sampler = TiledSampler(SamplerConfig(max(slots) + 1 + extra_slots, canvas_length, vocab, embed, HIDDEN**0.5,
                                         tiling=tiling, impl=impl, chunk_size=chunk_size))  # fmt: skip
    for slot, p, start in zip(slots, params, starts):
        sampler.start_canvas(slot, p, 0, start)
    idx = torch.tensor(slots)
    frames = [{"canvas": sampler.canvas[idx].clone()}]
    for logits in logits_seq:
        sampler.step(logits, slots)
        frames.append({name: getattr(sampler, name)[idx].clone()
                       for name in ("canvas", "draft", "history", "out_accepted", "out_converged")})  # fmt: skip
    return frames


@st.composite
def batches(draw, max_n: int = 5):
    n, canvas_length, vocab = draw(st.integers(1, max_n)), draw(st.integers(1, 6)), draw(st.integers(2, 40))
    starts = draw(st.lists(canvas_starts(canvas_length, vocab), min_size=n, max_size=n))
    greedy = draw(st.lists(st.booleans(), min_size=n, max_size=n))
    seed = draw(st.integers(0, 2**40))
    params = [SamplingParams(seed=seed + i, greedy=greedy[i], max_denoising_steps=STEPS, entropy_bound=0.2) for i in range(n)]
    logits_seq = [logits_for(n, canvas_length, vocab, seed=k + seed % 1000) for k in range(STEPS)]
    return starts, params, logits_seq


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batch=batches())
def test_a_pinned_position_holds_its_token_in_every_canvas_and_draft(batch):
    starts, params, logits_seq = batch
    frames = run(starts, params, list(range(len(params))), logits_seq)
    for row, start in enumerate(starts):
        head = frames[0]["canvas"][row, : len(start.tokens)].tolist()
        pinned = dict(start.pins)
        assert head == [pinned.get(i, t) for i, t in enumerate(start.tokens)]  # a pin wins over the start there
        for position, token in start.pins:
            assert all(int(f["canvas"][row, position]) == token for f in frames)
            assert all(int(f["draft"][row, position]) == token for f in frames[1:])
            assert all(bool(f["out_accepted"][row, position]) for f in frames[1:])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batch=batches(), tile=st.integers(1, 5), extra_slots=st.integers(0, 3), data=st.randoms(use_true_random=False))
def test_tiled_equals_untiled_with_pins_and_starts(batch, tile, extra_slots, data):
    starts, params, logits_seq = batch
    n = len(params)
    untiled = run(starts, params, list(range(n)), logits_seq)
    slots = list(range(extra_slots, extra_slots + n))
    data.shuffle(slots)
    assert_same(untiled, run(starts, params, slots, logits_seq, tiling=tile, extra_slots=extra_slots))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batch=batches(), tile=st.integers(1, 5), chunk_size=st.integers(1, 40))
def test_chunked_equals_reference_with_pins_and_starts(batch, tile, chunk_size):
    starts, params, logits_seq = batch
    slots = list(range(len(params)))
    reference = run(starts, params, slots, logits_seq)
    chunked = run(starts, params, slots, logits_seq, impl="chunked", tiling=tile, chunk_size=chunk_size)
    for ref, got in zip(reference, chunked, strict=True):
        for name in ("canvas", "draft", "out_accepted", "out_converged"):
            if name in ref:
                assert torch.equal(ref[name], got[name]), name


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batch=batches(max_n=6), tile=st.integers(1, 6))
def test_a_request_gives_the_same_tokens_alone_and_among_pinned_and_started_batch_mates(batch, tile):
    starts, params, logits_seq = batch
    mine = len(params) - 1  # the last request, watched alone and in the batch
    alone = run([starts[mine]], [params[mine]], [0], [l[mine:] for l in logits_seq])
    together = run(starts, params, list(range(len(params))), logits_seq, tiling=tile)
    for a, b in zip(alone, together, strict=True):
        for key in a:
            assert torch.equal(a[key][0], b[key][mine]), key


def test_a_slot_forgets_its_previous_requests_pins():
    CL, V = 6, 30
    logits_seq = [logits_for(2, CL, V, seed=k) for k in range(STEPS)]
    params = [SamplingParams(seed=1, max_denoising_steps=STEPS), SamplingParams(seed=2, max_denoising_steps=STEPS)]
    fresh = run([CanvasStart(), CanvasStart(pins=((0, 5),))], params, [0, 1], logits_seq)
    embed = torch.randn(V, HIDDEN, generator=torch.Generator().manual_seed(7))
    sampler = TiledSampler(SamplerConfig(2, CL, V, embed, HIDDEN**0.5, tiling="off"))
    sampler.start_canvas(0, params[0], 0, CanvasStart(pins=((3, 7), (4, 8))))  # an earlier request in slot 0
    sampler.free(0)
    sampler.start_canvas(0, params[0], 0)
    sampler.start_canvas(1, params[1], 0, CanvasStart(pins=((0, 5),)))  # a pinned tile-mate: pins are read
    for logits, expected in zip(logits_seq, fresh[1:]):
        sampler.step(logits, [0, 1])
        assert torch.equal(sampler.canvas[:2], expected["canvas"])


def characters(text: str) -> list[int]:
    """A stand-in tokenizer: one token per character, 'xy' is one token (id 99)."""
    return [99] if text == "xy" else [ord(c) for c in text]


# A pin's position that is no whole number, an empty piece and pins that are no object are the door's to
# refuse (tests/test_settings.py): the model is asked only about pins that are well formed.
@pytest.mark.parametrize("start, pins, sentence", [
    ("abcdefghi", (), "the start text is 9 tokens but the canvas holds 8; shorten it to the first canvas"),
    (None, ((8, "a"),), "pin position 8 is outside the canvas (positions 0 to 7)"),
    (None, ((2, "abc"),), "the pin at position 2 ('abc') is not one token of the vocabulary (it is 3 tokens)"),
])  # fmt: skip
def test_a_bad_start_or_pin_is_refused_with_one_sentence(start, pins, sentence):
    assert resolve_start(start, pins, 8, characters) == (sentence, CanvasStart())


def test_pins_and_a_start_resolve_to_token_ids():
    error, start = resolve_start("ab", ((5, "xy"), (0, "c")), 8, characters)
    assert error == ""
    assert start == CanvasStart((97, 98), ((0, ord("c")), (5, 99)))
