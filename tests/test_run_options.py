"""The lesson's two run options, beside tiling, step and budget: a tile that runs out of memory fails
the run (`fail_on_oom`), and the logits padded to a vocabulary (`pad_vocab`, the real scale)."""

from __future__ import annotations

import torch

from dgemma.engine import EngineConfig, EngineCore
from dgemma.events import RequestEvent
from dgemma.gpus import RELEASED_VOCAB
from dgemma.sampling import RunOptions, SamplerConfig, SamplingParams, TiledSampler
from dgemma.sampling.primitives import PAD_LOGIT
from dgemma.examples import lesson_prompts
from dgemma.units import parse_size
from compare_runs import drive
from lesson_budget import lesson_budget


def test_a_tile_out_of_memory_fails_the_run_with_its_sentence_and_numbers_instead_of_preempting(embedded_model):
    n = 8
    budget = parse_size(lesson_budget(embedded_model, n))
    core = EngineCore(embedded_model, EngineConfig(max_num_seqs=n))
    watch = core.subscribe(coalesce=False)
    options = RunOptions(tiling="off", memory_budget=budget, fail_on_oom=True)
    handles = [core.submit(p, SamplingParams(max_denoising_steps=4, seed=i), 16, options=options)
               for i, p in enumerate(lesson_prompts(n))]
    drive(core)
    finals = [h.result(0) for h in handles]
    sentence = f"The sampler step of {n} requests in one tile raised torch.OutOfMemoryError."
    assert [(f.status, f.error) for f in finals] == [("error", sentence)] * n
    figures = finals[0].extra["oom"]
    assert figures["requests"] == n and figures["needed_bytes"] > figures["free_bytes"] > 0 and figures["detail"]
    events = watch.poll(0)
    assert not any(isinstance(e, RequestEvent) and e.extra.get("preempted") for e in events)  # never split, never preempted


def lessons_own_loop(loaded, prompts: list[str], params: list[SamplingParams], vocab: int) -> list[tuple[int, ...]]:
    """The real-scale lesson as it ran before it was an engine run: its own decode/sample loop, the
    decoder's logits padded to `vocab` with PAD_LOGIT, one canvas each, tokens cut at the end of text."""
    from dgemma.model.runner import Runner

    runner = Runner(loaded.model)
    embed = torch.zeros(vocab, loaded.hidden_size, dtype=loaded.embed_weight.dtype)
    embed[: loaded.vocab_size] = loaded.embed_weight.detach()
    sampler = TiledSampler(SamplerConfig(len(prompts), loaded.canvas_length, vocab, embed, loaded.embed_scale))
    caches = []
    for i, prompt in enumerate(prompts):
        caches.append(runner.new_cache())
        runner.append_to_cache(caches[i], torch.tensor(loaded.encode(prompt)))
        sampler.start_canvas(i, params[i], 0)
    tokens, active = {}, list(range(len(prompts)))
    while active:
        with torch.no_grad():
            logits = runner.decode(sampler.canvas[active] % loaded.vocab_size, sampler.soft_embeds(active), None,
                                   [caches[i] for i in active])
            logits = torch.nn.functional.pad(logits, (0, vocab - logits.shape[-1]), value=PAD_LOGIT)
            out = sampler.step(logits, active)
        for slot, done, draft in zip(list(active), out.converged.tolist(), out.draft.tolist(), strict=True):
            if done:
                cut = next((j for j, t in enumerate(draft) if t in loaded.eos_token_ids), len(draft))
                tokens[slot] = tuple(draft[:cut])
                active.remove(slot)
    return [tokens[i] for i in range(len(prompts))]


def test_padded_logits_give_the_tokens_of_the_real_scale_lesson(embedded_model):
    prompts = lesson_prompts(4)
    params = [SamplingParams(max_denoising_steps=3, seed=5 + i) for i in range(4)]
    core = EngineCore(embedded_model, EngineConfig(max_num_seqs=4))
    options = RunOptions(tiling="off", pad_vocab=RELEASED_VOCAB)
    handles = [core.submit(p, q, embedded_model.canvas_length, options=options) for p, q in zip(prompts, params)]
    drive(core)
    assert [h.result(0).token_ids for h in handles] == lessons_own_loop(embedded_model, prompts, params, RELEASED_VOCAB)
