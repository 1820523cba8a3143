"""The lesson's batch: N prompts, one canvas each, denoised together under one memory budget.

A small, explicit loop over the public sampler contract (docs/architecture.md) rather than the
engine's scheduler: the lesson wants one fixed batch that all hits the sampler at once, with the
memory device and the vocabulary under its control, and the raw out-of-memory of an untiled
step (the engine would preempt instead). It runs on the engine's own weights and runner, holding
the engine's lock, so an engine step and the lesson never run at once over the same weights.

- memory: on CUDA a per-process cap (a real allocator OOM); on a CPU the budgeted virtual
  device, holding the weights and the sampler's per-slot state as resident bytes;
- "real scale": the logits are padded to vocab 262,144 with a large negative value, so the
  sampler's [requests x CL x vocab] tensors have the released model's size while the tokens stay
  the small model's (padded columns have probability 0: no token, no entropy, no soft-embedding
  weight comes from them; re-noised ids beyond the real vocabulary are folded back into it
  before the decoder reads the canvas).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import torch

from dgemma.engine import EngineCore
from dgemma.engine.output import to_host
from dgemma.errors import first_line
from dgemma.events import Event
from dgemma.gpus import RELEASED_VOCAB
from dgemma.memory import (
    CudaMemory,
    HostMemory,
    MemoryDevice,
    VirtualDevice,
    format_bytes,
    memory_for,
    parse_size,
)  # fmt: skip
from dgemma.model.loading import LoadedModel
from dgemma.sampling import TiledSampler, build_sampler, calibrate_tile, reference_tile
from dgemma.serving.backend import LessonOutcome
from dgemma.serving.lesson_events import LessonEvents
from dgemma.settings import Settings

REAL_VOCAB = RELEASED_VOCAB
PAD_LOGIT = -1.0e4  # exp(PAD_LOGIT - max) underflows to 0 in fp32; finite, so 0 * logp stays 0
PROMPTS = ("add 12+34", "reverse hello", "count 5 to 12", "story: big cat, park")  # the embedded model's tasks


def _vocab(loaded: LoadedModel, real_scale: bool) -> int:
    return max(REAL_VOCAB, loaded.vocab_size) if real_scale else loaded.vocab_size


def _embed(loaded: LoadedModel, vocab: int) -> torch.Tensor:
    weight = loaded.embed_weight.detach()
    if vocab == weight.shape[0]:
        return weight
    padded = torch.zeros(vocab, weight.shape[1], dtype=weight.dtype, device=weight.device)
    padded[: weight.shape[0]] = weight
    return padded


def _sampler(loaded: LoadedModel, n: int, vocab: int, memory: MemoryDevice, tiling: str, impl: str) -> TiledSampler:
    embed = _embed(loaded, vocab)
    return build_sampler(impl, n, loaded.canvas_length, vocab, embed, loaded.embed_scale, memory=memory, tiling=tiling)


def _state_bytes(sampler: TiledSampler) -> int:
    tensors = [t for t in vars(sampler).values() if isinstance(t, torch.Tensor)]
    return sum(t.untyped_storage().nbytes() for t in tensors)


def _memory(loaded: LoadedModel, budget: int | None) -> MemoryDevice:
    if budget is None:
        return HostMemory() if loaded.device.type != "cuda" else CudaMemory(loaded.device)
    return memory_for(loaded.device, budget)


def suggest_budget(loaded: LoadedModel, requests: int, real_scale: bool) -> str:
    """A budget where one tile of all `requests` cannot fit but smaller tiles can.

    Free memory (budget minus weights and sampler state) is set to 3/4 of what the single
    untiled tile needs at its peak: the untiled step runs out of memory, while the planner,
    which gives a tile half of what is free, runs tiles of about 3/8 of the batch.
    """
    vocab = _vocab(loaded, real_scale)
    sampler = _sampler_meta(loaded, requests, vocab)
    calibration = sampler.calibration()
    resident = _resident_bytes(loaded) + _state_bytes(sampler)
    free = max(int(0.75 * calibration.tile_bytes(requests)), 2 * calibration.tile_bytes(1) + calibration.bytes_per_request)
    return _round_mib(resident + free)


def _resident_bytes(loaded: LoadedModel) -> int:
    """What the budget already holds before the lesson's sampler: on CUDA everything this process
    has allocated (weights, the serving engine's state and caches); on a CPU the weights."""
    if loaded.device.type == "cuda":
        return int(torch.cuda.memory_allocated(loaded.device))
    return loaded.weight_bytes


def _sampler_meta(loaded: LoadedModel, n: int, vocab: int) -> TiledSampler:
    """The lesson's sampler on meta tensors (no memory), its step measured as it runs on the model's device."""
    embed = torch.empty(vocab, loaded.hidden_size, dtype=loaded.embed_weight.dtype, device="meta")
    calibration = calibrate_tile(reference_tile, loaded.canvas_length, vocab, embed, device=loaded.device)
    return TiledSampler(n, loaded.canvas_length, vocab, embed, loaded.embed_scale, calibration=calibration)


def _round_mib(nbytes: int) -> str:
    """Whole MiB when that is close enough (a readable budget); KiB for a tiny model's bytes."""
    mib = -(-nbytes // 2**20)
    if mib >= 64:
        return f"{mib}MiB"
    return f"{-(-nbytes // 1024)}KiB"


def run(core: EngineCore, requests: int, budget: str | None, real_scale: bool, tiling: str,
        settings: Settings, impl: str = "reference",
        on_events: Callable[[list[Event]], None] | None = None) -> LessonOutcome:
    """Denoise one canvas for `requests` prompts (seeds S + i) and report what happened; `on_events`,
    when given, is called with each step's events as the run goes (dgemma/serving/lesson_events.py)."""
    for item in stream(core, requests, budget, real_scale, tiling, settings, impl, events=on_events is not None):
        if isinstance(item, LessonOutcome):
            return item
        on_events(item)
    raise AssertionError("a lesson run ends with its outcome")


def stream(core: EngineCore, requests: int, budget: str | None, real_scale: bool, tiling: str,
           settings: Settings, impl: str = "reference", events: bool = False) -> Iterator[list[Event] | LessonOutcome]:
    """`run` as a generator: each step's events (lists, when `events`) as the run goes, its outcome last
    (the ZeroGPU worker yields them across its process).

    Runs inside `core.exclusive()`: the engine pauses after its current step (the batch is small:
    seconds at most) and goes on afterwards.
    On CUDA the budget is the process's allocator cap while the lesson runs; the cap the server
    had is put back afterwards.
    """
    with core.exclusive():
        if core.loaded.device.type != "cuda":
            yield from _run(core, requests, budget, real_scale, tiling, settings, impl, events)
            return
        cap = torch.cuda.get_per_process_memory_fraction(core.loaded.device)
        try:
            yield from _run(core, requests, budget, real_scale, tiling, settings, impl, events)
        finally:
            torch.cuda.set_per_process_memory_fraction(cap, core.loaded.device)
            torch.cuda.empty_cache()


def _run(core: EngineCore, requests: int, budget: str | None, real_scale: bool, tiling: str,
         settings: Settings, impl: str, events: bool) -> Iterator[list[Event] | LessonOutcome]:
    started = time.monotonic()
    loaded, runner = core.loaded, core.runner
    try:
        budget_bytes = parse_size(budget) if budget not in (None, "") else None
    except ValueError:
        raise ValueError(f"The memory budget {str(budget)[:40]!r} is not a size such as 512MiB or 2GiB.") from None
    vocab = _vocab(loaded, real_scale)
    memory = _memory(loaded, budget_bytes)
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(requests)]
    params = [settings.request_params(i) for i in range(requests)]
    try:
        if isinstance(memory, VirtualDevice):
            memory.reserve(loaded.weight_bytes, "the model weights")
        sampler = _sampler(loaded, requests, vocab, memory, tiling, impl)
        if isinstance(memory, VirtualDevice):
            memory.reserve(_state_bytes(sampler), "the sampler's per-slot state")
    except torch.OutOfMemoryError:
        raise ValueError(
            f"The budget of {format_bytes(budget_bytes or 0)} cannot even hold the model's weights and the "
            f"sampler's state; the suggested budget for {requests} requests is {suggest_budget(loaded, requests, real_scale)}."
        ) from None

    caches = []
    for i, prompt in enumerate(prompts):
        cache = runner.new_cache()
        runner.append_to_cache(cache, torch.tensor(core.tokenize(prompt)))
        caches.append(cache)
        sampler.start_canvas(i, params[i], 0)
    told = LessonEvents(prompts, params, core.detok.piece, core.detok.text) if events else None
    if told is not None:  # the random starts, folded back into the model's vocabulary as the decoder reads them
        yield told.start((sampler.canvas[:requests] % loaded.vocab_size).tolist(), vocab)

    plans, tokens, calls = [], {}, []
    active = list(range(requests))
    free_before = memory.free_bytes()
    needed = sampler.calibration().tile_bytes(requests)
    try:
        while active:
            canvas = sampler.canvas[active] % loaded.vocab_size  # fold padded ids back (real scale)
            soft = sampler.soft_embeds(active)
            with torch.no_grad():
                logits = runner.decode(canvas, soft, None, [caches[i] for i in active])
                if vocab != logits.shape[-1]:
                    logits = torch.nn.functional.pad(logits, (0, vocab - logits.shape[-1]), value=PAD_LOGIT)
                free_before = memory.free_bytes()
                calls.append(tuple(active))
                out = sampler.step(logits, active)
            del logits
            plans.append(out.plan)
            drafts, entropies, accepted, means, done, _finite = to_host(out)  # one host copy a step
            if told is not None:
                yield told.step(out.plan, list(active), len(plans), drafts, entropies, accepted, means, done,
                                lambda slot: sampler.take_logprobs(slot).tolist())
            for slot, finished, draft in zip(list(active), done, drafts, strict=True):
                if finished:
                    tokens[slot] = tuple(draft)
                    active.remove(slot)
    except torch.OutOfMemoryError as err:
        # The lesson's point: the step of one tile of every request does not fit.
        message = f"The sampler step of {len(active)} requests in one tile raised torch.OutOfMemoryError."
        if told is not None:
            yield told.failed(active, message)
        yield LessonOutcome(
            tiling, False, message,
            needed_bytes=needed, free_bytes=free_before, plans=plans, tokens=tokens, calls=calls,
            seconds=time.monotonic() - started, detail=first_line(err, 300),
        )
        return
    where = f"{memory.name} device" + (f", budget {format_bytes(budget_bytes)}" if budget_bytes else ", no budget")
    yield LessonOutcome(
        tiling, True, f"{requests} requests denoised one canvas each ({where}, vocab {vocab:,}).",
        needed_bytes=needed, free_bytes=free_before, plans=plans, tokens=tokens, calls=calls,
        seconds=time.monotonic() - started,
    )
