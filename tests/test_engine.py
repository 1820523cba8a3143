"""The engine: continuous batching that changes no request's tokens, and failures that stay local."""

from __future__ import annotations

import threading

import pytest
import torch

from dgemma.engine import Engine, EngineConfig, EngineError
from dgemma.events import RequestEvent, StepEvent, TilePlan
from dgemma.engine.mailbox import Mailbox
from dgemma.model.loading import load_model
from dgemma.sampling import SamplingParams
from faults import install_faults

STEPS = 3  # random weights never converge: every canvas takes max_denoising_steps


def params(seed: int, greedy: bool = False, steps: int = STEPS) -> SamplingParams:
    return SamplingParams(max_denoising_steps=steps, seed=seed, greedy=greedy)


def wait_for_step(handle, timeout: float = 60.0) -> None:
    for event in handle.events(timeout=timeout):
        if isinstance(event, StepEvent):
            return
    raise AssertionError(f"request {handle.id} took no step")


@pytest.fixture
def engine(tiny_model):
    with Engine(tiny_model, EngineConfig(max_num_seqs=4)) as eng:
        yield eng


@pytest.mark.parametrize("greedy", [False, True], ids=["seeded", "greedy"])
def test_request_gives_identical_tokens_alone_and_in_a_batch_of_32_with_arrivals_and_departures(tiny_model, greedy):
    target = dict(prompt="count 3 to 9", params=params(seed=7, greedy=greedy), max_new_tokens=48)
    with Engine(tiny_model, EngineConfig(max_num_seqs=32)) as eng:
        alone = eng.submit(**target).result(120)

        early = [eng.submit(f"add {i}+{i}", params(seed=100 + i), max_new_tokens=16) for i in range(10)]
        watched = eng.submit(**target)
        wait_for_step(watched)  # the rest arrive while it is denoising, the early ones leave
        late = [eng.submit(f"reverse {'abcdefgh'[: 1 + i % 8]}", params(seed=200 + i), max_new_tokens=32) for i in range(21)]
        batched = watched.result(120)
        finals = [h.result(120) for h in early + late]

    assert all(f.status == "done" for f in finals)
    assert alone.status == batched.status == "done"
    assert batched.token_ids == alone.token_ids
    assert batched.extra["logprobs"] == alone.extra["logprobs"]  # the logits matched bit for bit too
    assert (batched.steps, batched.canvases) == (alone.steps, alone.canvases)
    assert batched.canvases >= 2  # it lived through the arrivals and departures


def test_embedded_model_request_is_identical_alone_and_among_32_with_arrivals_and_departures(embedded_model):
    from dgemma.bench.engine import bench_prompts

    def settings(seed: int, greedy: bool = False) -> SamplingParams:
        return SamplingParams.from_generation_config(embedded_model.model.generation_config, seed=seed, greedy=greedy)

    targets = [("count 12 to 20", settings(5)), ("add 31+45", settings(6, greedy=True))]
    others = bench_prompts(30)
    with Engine(embedded_model, EngineConfig(max_num_seqs=32)) as eng:
        alone = [eng.submit(p, q, max_new_tokens=48).result(120) for p, q in targets]
        first = [eng.submit(p, settings(100 + i), max_new_tokens=16) for i, p in enumerate(others[:15])]
        watched = [eng.submit(p, q, max_new_tokens=48) for p, q in targets]
        wait_for_step(watched[0])
        later = [eng.submit(p, settings(200 + i), max_new_tokens=48) for i, p in enumerate(others[15:])]
        together = [h.result(120) for h in watched]
        assert all(h.result(120).status == "done" for h in first + later)
    for a, b in zip(alone, together):
        assert a.status == b.status == "done"
        assert (b.token_ids, b.steps, b.extra["logprobs"]) == (a.token_ids, a.steps, a.extra["logprobs"])


def test_first_step_of_each_canvas_matches_transformers_forward_on_its_own_cache(tiny_model):
    from transformers import DynamicCache

    from dgemma.sampling import SamplerConfig, TiledSampler

    prompt, settings = "count 1 to 4", params(seed=11, greedy=True)
    with Engine(tiny_model, EngineConfig(max_num_seqs=2)) as eng:
        watch = eng.subscribe(tile_plans=False, coalesce=False)
        final = eng.submit(prompt, settings, max_new_tokens=32).result(60)
        events = watch.poll(1.0)
    assert final.status == "done" and final.canvases == 2 and len(final.token_ids) == 32
    firsts = {e.canvas_index: e.token_ids for e in events if isinstance(e, StepEvent) and e.step == 1}

    start = TiledSampler(SamplerConfig(1, tiny_model.canvas_length, tiny_model.vocab_size, tiny_model.embed_weight, 1.0))
    cache = DynamicCache(config=tiny_model.model.config.text_config)
    context = torch.tensor([tiny_model.encode(prompt)])
    for canvas_index in (0, 1):
        with torch.no_grad():
            positions = torch.arange(cache.get_seq_length(), cache.get_seq_length() + context.shape[1])[None]
            tiny_model.model.model.encoder(input_ids=context, past_key_values=cache, position_ids=positions)
            start.start_canvas(0, settings, canvas_index)  # the request's keyed initial noise
            logits = tiny_model.model(decoder_input_ids=start.canvas[:1], past_key_values=cache).logits
        assert firsts[canvas_index] == tuple(logits.argmax(-1)[0].tolist())
        context = torch.tensor([final.token_ids[:16]])  # the committed canvas is encoded next


def test_more_requests_than_max_num_seqs_all_complete_in_admission_order(tiny_model):
    with Engine(tiny_model, EngineConfig(max_num_seqs=2)) as eng:
        watch = eng.subscribe(tile_plans=False)
        handles = [eng.submit(f"add {i}+1", params(seed=i), max_new_tokens=16) for i in range(6)]
        finals = [h.result(60) for h in handles]
        events = watch.poll(1.0)
    assert [f.status for f in finals] == ["done"] * 6
    admitted = [e.request_id for e in events if isinstance(e, RequestEvent) and e.status == "running"]
    assert admitted == [h.id for h in handles]
    for h in handles:  # each request's life reads in order: queued, running, ..., done
        statuses = [e.status for e in events if isinstance(e, RequestEvent) and e.request_id == h.id]
        assert statuses[:2] == ["queued", "running"] and statuses[-1] == "done"
    assert max(e.steps for e in finals) == STEPS


def test_cancel_frees_the_slot_within_one_step(tiny_model):
    from dgemma.engine import EngineCore

    core = EngineCore(tiny_model, EngineConfig(max_num_seqs=1))  # driven here: no step between the count and the cancel
    long = core.submit("count 1 to 9", params(seed=1, steps=40), max_new_tokens=160)
    queued = core.submit("add 1+1", params(seed=2), max_new_tokens=16)
    for _ in range(3):
        core.step()
    steps_before = core.stats["steps"]
    long.cancel()
    core.step()
    final = long.result(0)
    assert final.status == "cancelled" and final.steps <= steps_before + 1
    while core.has_unfinished():
        core.step()
    assert queued.result(0).status == "done"  # it got the freed slot


def test_eos_ends_a_request_early(tiny_model_dir):
    loaded = load_model(tiny_model_dir, device="cpu")
    weight = loaded.model.lm_head.weight  # tied with the embeddings: only <eos> and zeros remain
    eos = loaded.eos_token_ids[0]
    with torch.no_grad():
        keep = weight[eos].clone()
        weight.zero_()
        weight[eos] = keep
    with Engine(loaded, EngineConfig(max_num_seqs=2)) as eng:
        final = eng.submit("add 1+2", params(seed=0, greedy=True), max_new_tokens=64).result(60)
    assert final.status == "done" and final.extra["stop_reason"] == "eos"
    assert final.canvases == 1 and len(final.token_ids) < loaded.canvas_length
    assert eos not in final.token_ids


def test_nan_logits_fail_only_that_request(engine):
    faults = install_faults(engine.core)
    handles = [engine.submit(f"add {i}+3", params(seed=i), max_new_tokens=32) for i in range(3)]
    faults.nan_requests.add(handles[1].id)
    finals = [h.result(60) for h in handles]
    assert [f.status for f in finals] == ["done", "error", "done"]
    assert "NaN or infinite logits" in finals[1].error and "\n" not in finals[1].error


def test_decoder_out_of_memory_is_retried_with_fewer_requests_and_none_is_lost(tiny_model):
    prompts = [f"sort {i} 3 1" for i in range(4)]
    with Engine(tiny_model, EngineConfig(max_num_seqs=4)) as eng:
        reference = eng.run_until_done(prompts, [params(seed=i) for i in range(4)], max_new_tokens=32)
        install_faults(eng.core).decoder_oom_above = 1  # any decoder batch of 2+ requests runs out of memory
        retried = eng.run_until_done(prompts, [params(seed=i) for i in range(4)], max_new_tokens=32)
        assert eng.stats["decoder_splits"] > 0
    assert [r.status for r in retried] == ["done"] * 4
    assert [r.token_ids for r in retried] == [r.token_ids for r in reference]


def test_memory_budget_holds_weights_cache_and_transient(tiny_model):
    budget = tiny_model.weight_bytes + 24 * 2**20
    with Engine(tiny_model, EngineConfig(max_num_seqs=4, memory_budget=budget)) as eng:
        watch = eng.subscribe()
        finals = eng.run_until_done([f"add {i}+5" for i in range(4)], [params(seed=i) for i in range(4)], max_new_tokens=32)
        plans = [e for e in watch.poll(1.0) if isinstance(e, TilePlan)]
        memory = eng.memory
    assert [f.status for f in finals] == ["done"] * 4
    assert memory.capacity == budget
    assert tiny_model.weight_bytes < memory.peak_total <= budget  # weights + caches + transient, measured
    assert plans and all(p.budget_bytes == budget and p.peak_transient_bytes > 0 for p in plans)


def test_decoder_out_of_a_real_memory_budget_is_split_and_retried_with_the_same_tokens(tiny_model):
    prompts = [f"add {i}+7" for i in range(8)]
    settings = [params(seed=i) for i in range(8)]
    roomy = tiny_model.weight_bytes + 64 * 2**20
    with Engine(tiny_model, EngineConfig(max_num_seqs=8, memory_budget=roomy)) as eng:
        watch = eng.subscribe(coalesce=False)
        reference = eng.run_until_done(prompts, settings, max_new_tokens=16)
        first_plan = next(e for e in watch.poll(1.0) if isinstance(e, TilePlan))
        held = roomy - first_plan.free_bytes  # weights, sampler state, caches: what a step starts from
        decode_peak = eng.memory.peak_total - held
    tight = held + decode_peak // 2  # the 8-request decoder step no longer fits; half of it does
    with Engine(tiny_model, EngineConfig(max_num_seqs=8, memory_budget=tight)) as eng:
        retried = eng.run_until_done(prompts, settings, max_new_tokens=16)
        assert eng.stats["decoder_splits"] > 0
    assert [r.status for r in retried] == ["done"] * 8
    assert [r.token_ids for r in retried] == [r.token_ids for r in reference]


def test_requests_whose_kv_caches_fill_the_budget_are_preempted_and_restart_with_the_same_tokens(embedded_model):
    from dgemma.embedded import corpus

    prompts = [ex.prompt for ex in corpus.heldout("prose", 8)]  # two canvases each: caches grow
    settings = [SamplingParams(seed=i) for i in range(8)]
    with Engine(embedded_model, EngineConfig(max_num_seqs=8)) as eng:
        reference = eng.run_until_done(prompts, settings, max_new_tokens=32)
    # Weights, the sampler's slots and about half a MiB: not enough for eight requests at once.
    tight = embedded_model.weight_bytes + 2**19
    with Engine(embedded_model, EngineConfig(max_num_seqs=8, memory_budget=tight)) as eng:
        watch = eng.subscribe(coalesce=False)
        squeezed = eng.run_until_done(prompts, settings, max_new_tokens=32)
        preemptions = eng.stats["preemptions"]
        requeued = [e for e in watch.poll(1.0) if isinstance(e, RequestEvent) and e.extra.get("preempted")]
    assert preemptions > 0 and len(requeued) == preemptions
    assert all(e.status == "queued" and "same seed" in e.extra["preempted"] for e in requeued)
    assert [r.status for r in squeezed] == ["done"] * 8  # none lost to out of memory
    assert [r.token_ids for r in squeezed] == [r.token_ids for r in reference]


def test_a_commit_whose_kv_bytes_cannot_be_held_is_not_appended_again_on_the_retry(embedded_model):
    from dgemma.embedded import corpus

    prompts = [ex.prompt for ex in corpus.heldout("prose", 8)]  # two canvases each: the first is committed
    settings = [SamplingParams(seed=i) for i in range(8)]
    with Engine(embedded_model, EngineConfig(max_num_seqs=8)) as eng:
        reference = eng.run_until_done(prompts, settings, max_new_tokens=32)
    with Engine(embedded_model, EngineConfig(max_num_seqs=8)) as eng:
        faults = install_faults(eng.core)
        faults.kv_oom_after_append = 3  # three caches grow by their commit, then their bytes do not fit
        retried = eng.run_until_done(prompts, settings, max_new_tokens=32)
    assert faults.kv_oom_after_append == 0
    assert [r.status for r in retried] == ["done"] * 8
    assert [r.token_ids for r in retried] == [r.token_ids for r in reference]  # each commit in the cache once


def test_an_untiled_sampler_step_that_runs_out_of_memory_preempts_and_keeps_the_tokens(embedded_model):
    from dgemma.embedded import corpus

    prompts = [ex.prompt for ex in corpus.heldout("prose", 8)]
    settings = [SamplingParams(seed=i) for i in range(8)]
    with Engine(embedded_model, EngineConfig(max_num_seqs=8)) as eng:
        reference = eng.run_until_done(prompts, settings, max_new_tokens=32)
    # One tile of all eight requests does not fit in the last 3/4 MiB; fewer requests at once do.
    tight = embedded_model.weight_bytes + 3 * 2**18
    with Engine(embedded_model, EngineConfig(max_num_seqs=8, tiling="off", memory_budget=tight)) as eng:
        watch = eng.subscribe(coalesce=False)
        squeezed = eng.run_until_done(prompts, settings, max_new_tokens=32)
        reasons = [e.extra["preempted"] for e in watch.poll(1.0) if isinstance(e, RequestEvent) and e.extra.get("preempted")]
    assert any("its sampler step does not fit" in r for r in reasons)
    assert [r.status for r in squeezed] == ["done"] * 8
    assert [r.token_ids for r in squeezed] == [r.token_ids for r in reference]


def test_a_request_that_cannot_fit_even_alone_fails_with_one_line_and_frees_the_queue(tiny_model):
    with Engine(tiny_model, EngineConfig(max_num_seqs=2)) as eng:
        faults = install_faults(eng.core)
        faults.decoder_oom_above = 0  # every decoder call runs out of memory, even for one request
        finals = eng.run_until_done(["add 1+1", "add 2+2"], [params(seed=1), params(seed=2)], max_new_tokens=16)
        faults.decoder_oom_above = None
        after = eng.submit("add 3+3", params(seed=3), max_new_tokens=16).result(30)
    assert [f.status for f in finals] == ["error", "error"]
    assert all("even with no other request running" in f.error and "\n" not in f.error for f in finals)
    assert after.status == "done"  # the engine was not left holding anything


def test_budget_smaller_than_the_weights_refuses_to_start_with_one_line(tiny_model):
    with pytest.raises(EngineError, match="too small for the model weights") as err:
        Engine(tiny_model, EngineConfig(memory_budget=2**20))
    assert "\n" not in str(err.value)


def test_engine_thread_death_fails_running_requests_keeps_queued_ones_and_restarts(tiny_model):
    with Engine(tiny_model, EngineConfig(max_num_seqs=1)) as eng:
        running = eng.submit("count 1 to 5", params(seed=1, steps=40), max_new_tokens=64)
        queued = eng.submit("add 3+3", params(seed=3), max_new_tokens=16)
        wait_for_step(running)
        install_faults(eng.core).crash_steps = 1
        died = running.result(30)
        assert died.status == "error" and "injected engine crash" in died.error and "\n" not in died.error
        assert queued.result(30).status == "done"  # not dropped: it ran on the restarted thread
        assert eng.submit("add 2+2", params(seed=2), max_new_tokens=16).result(30).status == "done"
        assert eng.alive and eng.deaths == 1 and "injected engine crash" in eng.last_error


def test_a_prompt_beyond_the_models_positions_fails_that_request_with_one_line_while_others_run(engine):
    # The call's values are the door's (dgemma/settings.py; tests/test_ui_render.py); the room a prompt's
    # tokens need is the model's, known once the engine has tokenized it.
    good = engine.submit("add 1+1", params(seed=1), max_new_tokens=16)
    bad = engine.submit("x" * 600, params(seed=2), max_new_tokens=16).result(60)
    assert bad.status == "error" and "positions" in bad.error and "\n" not in bad.error
    assert good.result(60).status == "done"


@pytest.mark.parametrize("prompt, settings, max_new_tokens", [(None, params(seed=1), 16), ("add 1+1", {"seed": 1}, 16),
                                                              ("add 1+1", params(seed=1), "16")],
                         ids=["prompt", "params", "max-new-tokens"])
def test_past_the_door_the_engine_asserts_types_and_parses_nothing(engine, prompt, settings, max_new_tokens):
    with pytest.raises(TypeError):
        engine.submit(prompt, settings, max_new_tokens=max_new_tokens)


def test_session_subscription_sees_only_its_own_requests(engine):
    mine = engine.subscribe(subscriber="a")
    a = engine.submit("add 1+1", params(seed=1), max_new_tokens=16, subscriber="a")
    b = engine.submit("add 2+2", params(seed=2), max_new_tokens=16, subscriber="b")
    a.result(60), b.result(60)
    seen = {e.request_id for e in mine.poll(1.0) if not isinstance(e, TilePlan)}
    assert seen == {a.id}


def test_a_subscriber_cannot_cancel_another_subscribers_request(tiny_model):
    with Engine(tiny_model, EngineConfig(max_num_seqs=1)) as eng:
        theirs = eng.submit("add 2+2", params(seed=9), max_new_tokens=16, subscriber="b")
        eng.cancel(theirs.id, subscriber="a")
        assert theirs.result(30).status == "done"


def test_cancel_subscriber_cancels_only_that_subscribers_requests(tiny_model):
    with Engine(tiny_model, EngineConfig(max_num_seqs=1)) as eng:
        a = [eng.submit("count 1 to 9", params(seed=i, steps=40), max_new_tokens=64, subscriber="a") for i in range(3)]
        b = eng.submit("add 2+2", params(seed=9), max_new_tokens=16, subscriber="b")
        assert eng.cancel_subscriber("a") == 3
        assert [h.result(30).status for h in a] == ["cancelled"] * 3
        assert b.result(30).status == "done"


def test_mailbox_coalesces_step_frames_but_never_drops_request_events():
    box = Mailbox()

    def frame(rid: int, step: int) -> StepEvent:
        return StepEvent(rid, 0, step, 9, (), (), (), (), 0.0, 0.005, False)

    box.put(RequestEvent(1, "running"))
    for step in range(1, 6):  # a slow reader: five frames arrive unread
        box.put(frame(1, step))
    box.put(RequestEvent(1, "committed"))
    box.put(frame(1, 1))
    box.put(frame(1, 2))
    box.put(RequestEvent(1, "done"))
    got = [(type(e).__name__, getattr(e, "status", None) or e.step) for e in box.poll()]
    assert got == [("RequestEvent", "running"), ("StepEvent", 5), ("RequestEvent", "committed"),
                   ("StepEvent", 2), ("RequestEvent", "done")]


def test_submit_cancel_and_stream_are_safe_from_many_threads(engine):
    results: dict[int, str] = {}

    def client(i: int) -> None:
        handle = engine.submit(f"add {i}+{i}", params(seed=i), max_new_tokens=16, subscriber=str(i))
        if i % 3 == 0:
            handle.cancel()
        results[i] = handle.result(60).status

    threads = [threading.Thread(target=client, args=(i,)) for i in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    assert len(results) == 12
    for i, status in results.items():  # a cancel may arrive after the request already finished
        assert status in (("cancelled", "done") if i % 3 == 0 else ("done",))


def test_chunked_sampler_gives_the_same_tokens_as_the_reference(tiny_model):
    prompts = ["add 1+2", "count 1 to 5", "reverse abc"]
    finals = {}
    for impl in ("reference", "chunked"):
        with Engine(tiny_model, EngineConfig(max_num_seqs=3, sampler=impl)) as eng:
            finals[impl] = eng.run_until_done(prompts, [params(seed=i) for i in range(3)], max_new_tokens=32)
    assert [f.token_ids for f in finals["chunked"]] == [f.token_ids for f in finals["reference"]]


def test_shutdown_cancels_unfinished_requests_and_later_submits_fail_with_one_line(tiny_model):
    eng = Engine(tiny_model, EngineConfig(max_num_seqs=1)).start()
    running = eng.submit("count 1 to 9", params(seed=1, steps=40), max_new_tokens=160)
    queued = eng.submit("add 1+1", params(seed=2), max_new_tokens=16)
    wait_for_step(running)
    eng.shutdown()
    assert running.result(5).status == queued.result(5).status == "cancelled"
    late = eng.submit("add 2+2", params(seed=3), max_new_tokens=16).result(5)
    assert late.status == "error" and "shut down" in late.error


def test_engine_that_keeps_dying_gives_up_fails_queued_requests_and_refuses_new_ones(tiny_model):
    with Engine(tiny_model, EngineConfig(max_num_seqs=1, max_restarts=1)) as eng:
        faults = install_faults(eng.core)
        faults.crash_steps = 5  # more deaths in a row than restarts allowed
        first = eng.submit("add 1+1", params(seed=1), max_new_tokens=16)
        second = eng.submit("add 2+2", params(seed=2), max_new_tokens=16)
        assert first.result(30).status == second.result(30).status == "error"
        late = eng.submit("add 3+3", params(seed=3), max_new_tokens=16).result(5)
        assert late.status == "error" and "restart it" in late.error
        faults.crash_steps = 0
        eng.start()  # a fresh thread after it gave up
        assert eng.submit("add 4+4", params(seed=4), max_new_tokens=16).result(30).status == "done"
