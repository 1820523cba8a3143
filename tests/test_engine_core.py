"""EngineCore without a thread: the caller steps it and receives the same events as through Engine."""

from __future__ import annotations

import dataclasses
import threading

from dgemma.engine import Engine, EngineConfig, EngineCore
from dgemma.events import RequestEvent, StepEvent
from dgemma.sampling import RunOptions, SamplingParams
from compare_runs import drive
from faults import install_faults

PROMPTS = ["add 1+2", "count 1 to 5", "reverse abc", "sort 3 1 2", "add 7+8"]


def params(seed: int, steps: int = 3) -> SamplingParams:
    return SamplingParams(max_denoising_steps=steps, seed=seed)


def test_core_stepped_by_the_caller_gives_the_same_tokens_and_events_as_the_engine_thread(tiny_model):
    config = EngineConfig(max_num_seqs=2)  # more prompts than slots: admission, commits, departures
    core = EngineCore(tiny_model, config)
    watch = core.subscribe(tile_plans=False, coalesce=False)
    handles = [core.submit(p, params(i), max_new_tokens=32) for i, p in enumerate(PROMPTS)]
    assert core.has_unfinished()
    drive(core)
    stepped = [h.result(0) for h in handles]
    events = watch.poll(0)

    with Engine(tiny_model, config) as eng:
        threaded_watch = eng.subscribe(tile_plans=False, coalesce=False)
        threaded = [eng.submit(p, params(i), max_new_tokens=32) for i, p in enumerate(PROMPTS)]
        threaded = [h.result(60) for h in threaded]
        threaded_events = threaded_watch.poll(1.0)

    assert [f.status for f in stepped] == ["done"] * len(PROMPTS)
    assert [f.token_ids for f in stepped] == [f.token_ids for f in threaded]
    assert [f.extra["logprobs"] for f in stepped] == [f.extra["logprobs"] for f in threaded]

    def frames(evs, first_id):
        return [(e.request_id - first_id, e.canvas_index, e.step, e.token_ids) for e in evs if isinstance(e, StepEvent)]

    def lives(evs, first_id):  # each request's own sequence (submits race the thread's steps)
        seen: dict[int, list] = {}
        for e in evs:
            if isinstance(e, RequestEvent):
                seen.setdefault(e.request_id - first_id, []).append((e.status, e.token_ids, e.text))
        return seen

    first, threaded_first = handles[0].id, min(e.request_id for e in threaded_events)
    assert sorted(frames(events, first)) == sorted(frames(threaded_events, threaded_first))
    assert lives(events, first) == lives(threaded_events, threaded_first)


def test_core_starts_no_thread(tiny_model):
    before = {t.ident for t in threading.enumerate()}
    core = EngineCore(tiny_model, EngineConfig(max_num_seqs=2))
    core.submit("add 1+1", params(1), max_new_tokens=16)
    drive(core)
    assert {t.ident for t in threading.enumerate()} <= before


def test_a_cancel_with_a_reason_puts_the_reason_in_the_final_event(tiny_model):
    core = EngineCore(tiny_model, EngineConfig(max_num_seqs=1))
    running = core.submit("count 1 to 9", params(1, steps=40), max_new_tokens=64)
    waiting = core.submit("add 1+1", params(2), max_new_tokens=16)
    core.step()
    core.cancel(running.id, reason="the GPU lease ended")
    core.cancel(waiting.id, reason="the tab was closed")
    drive(core)
    assert running.result(0).status == "cancelled" and running.result(0).error == "the GPU lease ended"
    assert waiting.result(0).status == "cancelled" and waiting.result(0).error == "the tab was closed"
    assert not core.has_unfinished()


def test_requests_with_different_run_options_share_one_decoder_batch_and_keep_their_tokens(tiny_model):
    layouts = [RunOptions(), RunOptions(tiling="off"), RunOptions(tiling=1, sampler="chunked"),
               RunOptions(memory_budget=tiny_model.weight_bytes + 64 * 2**20)]
    core = EngineCore(tiny_model, EngineConfig(max_num_seqs=4))
    alone = []
    for options in layouts:
        handle = core.submit("count 2 to 7", params(5), max_new_tokens=32, options=options)
        drive(core)
        alone.append(handle.result(0))
    calls = core.stats["decoder_calls"]
    together = [core.submit("count 2 to 7", params(5), max_new_tokens=32, options=o) for o in layouts]
    steps = drive(core)
    finals = [h.result(0) for h in together]
    assert [f.status for f in finals] == ["done"] * 4
    assert {f.token_ids for f in finals + alone} == {alone[0].token_ids}  # layout never changes tokens
    assert core.stats["decoder_calls"] - calls == steps  # one decoder batch per step for all four


def test_a_runs_own_memory_budget_caps_its_sampler_step_and_the_tokens_stay(embedded_model):
    from dgemma.embedded import corpus

    prompts = [ex.prompt for ex in corpus.heldout("prose", 8)]
    seeds = [SamplingParams(seed=i) for i in range(8)]
    roomy = EngineCore(embedded_model, EngineConfig(max_num_seqs=8))
    reference = [roomy.submit(p, s, max_new_tokens=32) for p, s in zip(prompts, seeds)]
    drive(roomy)
    # As an engine started with this --memory-budget: one untiled step of all eight does not fit.
    tight = RunOptions(tiling="off", memory_budget=embedded_model.weight_bytes + 3 * 2**18)
    core = EngineCore(embedded_model, EngineConfig(max_num_seqs=8))
    watch = core.subscribe(coalesce=False)
    squeezed = [core.submit(p, s, max_new_tokens=32, options=tight) for p, s in zip(prompts, seeds)]
    drive(core)
    events = watch.poll(0)
    reasons = [e.extra["preempted"] for e in events if isinstance(e, RequestEvent) and e.extra.get("preempted")]
    assert any("its sampler step does not fit" in r for r in reasons)
    assert [h.result(0).status for h in squeezed] == ["done"] * 8
    assert [h.result(0).token_ids for h in squeezed] == [h.result(0).token_ids for h in reference]
    plans = [e for e in events if not isinstance(e, (RequestEvent, StepEvent))]
    assert plans and all(p.budget_bytes == tight.memory_budget for p in plans)




def test_a_step_returns_what_it_scheduled_and_what_the_model_and_sampler_did(tiny_model):
    core = EngineCore(tiny_model, EngineConfig(max_num_seqs=2))
    handles = [core.submit(p, params(i), max_new_tokens=16) for i, p in enumerate(PROMPTS[:3])]
    first = core.step()
    assert dataclasses.is_dataclass(first) and dataclasses.is_dataclass(first.scheduled)
    ids = [h.id for h in handles[:2]]  # two slots: the third waits
    assert [r.id for r in first.scheduled.rows] == [r.id for r in first.scheduled.admitted] == ids
    assert [r.id for r, _ in first.executed.starts] == [r.id for r in first.executed.decoded] == ids
    assert [[r.id for r in s.rows] for s in first.executed.sampled] == [ids]
    assert first.executed.sampled[0].steps == [1, 1] and not first.executed.short
    second = core.step()
    assert second.scheduled.admitted == [] and not second.executed.starts  # the same canvases, denoising on
    drive(core)
    assert [h.result(0).status for h in handles] == ["done"] * 3


def test_a_request_short_of_memory_is_reported_by_execute_and_preempted_by_the_next_schedule(tiny_model):
    core = EngineCore(tiny_model, EngineConfig(max_num_seqs=2))
    faults = install_faults(core)
    older, newer = (core.submit(p, params(i), max_new_tokens=16) for i, p in enumerate(PROMPTS[:2]))
    faults.decoder_oom_above = 0  # every decoder call runs out of memory, even one request's
    short = core.step()
    assert [s.request.id for s in short.executed.short] == [older.id, newer.id]
    assert short.executed.decoded == [] and core.counts() == (2, 0)  # execute took no one out
    faults.decoder_oom_above = None
    after = core.step()
    assert [r.id for r in after.scheduled.preempted] == [newer.id]  # the newest-admitted makes room
    assert [r.id for r in after.scheduled.rows] == [r.id for r in after.executed.decoded] == [older.id]
    preempted = [e for e in newer.events(timeout=0) if isinstance(e, RequestEvent) and e.extra.get("preempted")]
    assert len(preempted) == 1 and "its decoder step does not fit" in preempted[0].extra["preempted"]
    drive(core)
    assert older.result(0).status == newer.result(0).status == "done"
