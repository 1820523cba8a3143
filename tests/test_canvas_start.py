"""Starting a canvas (edit) and pinning tokens (infill), checked against transformers on the embedded model.

transformers' `generate` runs with this engine's noise (tests/same_noise.py), so a request gives both
the same tokens exactly when their algorithms agree: with no start, with a start text (transformers'
`decoder_input_ids`), and for `tokens_per_forward` and the steps each canvas took.
"""

from __future__ import annotations

import pytest
import torch

from dgemma.embedded import corpus
from dgemma.engine import Engine, EngineConfig
from dgemma.events import RequestEvent, StepEvent
from dgemma.sampling import SamplingParams
from dgemma.sampling.keyed import INIT, RowKey, keyed_tokens, row_keys
from dgemma.settings import CanvasModel, Limits, Settings, make_request
from same_noise import keyed_generate
from compare_runs import until_eos

MAX_NEW_TOKENS = 48


def greedy(model, seed: int) -> SamplingParams:
    return SamplingParams.from_generation_config(model.model.generation_config, seed=seed, greedy=True)


def first_canvas(model, **shape):
    """`start=` and `pins=` as the engine takes them: resolved through the one door (dgemma/settings.py)."""
    return make_request(["x"], shape, Settings(), Limits(), 1, lambda: CanvasModel(model.canvas_length, model.encode_text)).canvas(0)


def engine_run(engine: Engine, prompt: str, params: SamplingParams, **shape) -> tuple[RequestEvent, list[int], list[StepEvent]]:
    """The request's final event, the steps each canvas took, and every one of its step frames.

    A handle's own stream coalesces frames a slow reader has not taken yet, so a busy machine could
    hide a canvas's step 0; an uncoalesced subscription keeps them all.
    """
    watch = engine.subscribe(tile_plans=False, coalesce=False)
    try:
        handle = engine.submit(prompt, params, MAX_NEW_TOKENS, start=first_canvas(engine.loaded, **shape))
        final = handle.result(120)
        events: list = []
        while final not in events[-1:]:  # the handle hears its final event before subscriptions do
            batch = watch.poll(10)
            assert batch, f"request {handle.id}'s final event never reached the subscription"
            events += [e for e in batch if e.request_id == handle.id]
    finally:
        engine.unsubscribe(watch)
    totals = [e.steps for e in events if isinstance(e, RequestEvent) and e.status == "committed"] + [final.steps]
    return final, [b - a for a, b in zip([0, *totals], totals)], [e for e in events if isinstance(e, StepEvent)]


@pytest.fixture(scope="module")
def engine(embedded_model):
    with Engine(embedded_model, EngineConfig(max_num_seqs=4)) as eng:
        yield eng


PROMPTS = [ex.prompt for family in corpus.FAMILIES for ex in corpus.heldout(family, 5)][:34]


def test_engine_matches_transformers_generate_given_the_same_noise(engine, embedded_model):
    model, eos = embedded_model.model, embedded_model.model.generation_config.eos_token_id
    for seed, prompt in enumerate(PROMPTS):
        params = greedy(embedded_model, seed)
        final, canvas_steps, _ = engine_run(engine, prompt, params)
        theirs = keyed_generate(model, embedded_model.encode(prompt), params, MAX_NEW_TOKENS)
        assert list(final.token_ids) == until_eos(theirs.new_tokens, eos)[:MAX_NEW_TOKENS], prompt
        assert canvas_steps == theirs.canvas_steps, prompt
        assert final.extra["metrics"]["tokens_per_forward"] == round(theirs.tokens_per_forward, 4), prompt


@pytest.mark.parametrize("start", ["12 13 14", "x", "12 13 14 15 16 1"])
def test_a_start_text_is_the_first_canvas_transformers_builds_from_decoder_input_ids(engine, embedded_model, start):
    prompt, params = "count 12 to 20", greedy(embedded_model, 7)
    final, canvas_steps, frames = engine_run(engine, prompt, params, start=start)
    first = next(f for f in frames if f.canvas_index == 0 and f.step == 0)
    # transformers' decoder_input_ids: the start's tokens from position 0, the rest of the canvas random
    start_ids = embedded_model.tokenizer(start, add_special_tokens=False).input_ids
    noise = keyed_tokens(row_keys([RowKey(params.seed, 0, 0)], INIT, torch.device("cpu")), 16, embedded_model.vocab_size)[0].tolist()
    decoder_input_ids = start_ids + noise[len(start_ids):]
    assert list(first.token_ids) == decoder_input_ids
    theirs = keyed_generate(embedded_model.model, embedded_model.encode(prompt), params, MAX_NEW_TOKENS, decoder_input_ids)
    eos = embedded_model.model.generation_config.eos_token_id
    assert list(final.token_ids) == until_eos(theirs.new_tokens, eos)[:MAX_NEW_TOKENS]
    assert canvas_steps == theirs.canvas_steps


def test_a_start_changes_only_the_first_canvas_start(engine, embedded_model):
    params = greedy(embedded_model, 3)
    _, _, plain = engine_run(engine, "count 40 to 51", params)
    _, _, started = engine_run(engine, "count 40 to 51", params, start="40 41")
    plain_starts = [f.token_ids for f in plain if f.step == 0]
    started_starts = [f.token_ids for f in started if f.step == 0]
    assert started_starts[0][:5] == tuple(embedded_model.encode_text("40 41"))
    assert started_starts[0][5:] == plain_starts[0][5:]
    assert len(started_starts) > 1  # the later canvases start from the keyed noise as always


def test_a_start_longer_than_the_canvas_is_refused_with_one_sentence(engine):
    with pytest.raises(ValueError) as refused:  # at the door, before the engine sees it
        first_canvas(engine.loaded, start="1 2 3 4 5 6 7 8 9")
    assert str(refused.value) == "the start text is 17 tokens but the canvas holds 16; shorten it to the first canvas"


def test_a_started_and_pinned_request_gives_the_same_tokens_alone_and_among_others(embedded_model):
    from dgemma.bench.engine import bench_prompts

    def sampled(seed: int) -> SamplingParams:
        return SamplingParams.from_generation_config(embedded_model.model.generation_config, seed=seed)

    target = dict(prompt="count 12 to 20", params=sampled(5), max_new_tokens=MAX_NEW_TOKENS,
                  start=first_canvas(embedded_model, start="12 1", pins={3: "3"}))
    with Engine(embedded_model, EngineConfig(max_num_seqs=8, tiling=2)) as eng:
        alone = eng.submit(**target).result(120)
        others = [eng.submit(p, sampled(100 + i), MAX_NEW_TOKENS,
                             start=first_canvas(embedded_model, pins={i % 16: "7"}, start="9" * (i % 4)))
                  for i, p in enumerate(bench_prompts(10))]
        together = eng.submit(**target).result(120)
        assert all(h.result(120).status == "done" for h in others)
    assert alone.status == together.status == "done"
    assert alone.text[3] == "3"  # the pin holds
    assert (together.token_ids, together.steps, together.extra["logprobs"]) == (alone.token_ids, alone.steps, alone.extra["logprobs"])
