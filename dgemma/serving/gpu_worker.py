"""The one `spaces.GPU` call: Run, the API and the lesson's runs all go through `run_on_gpu`.

On ZeroGPU each decorated function gets its own forked worker holding its own copy of the
weights, so there is exactly one, made once by `install()` before launch with the workload size
that holds the model (`large` or `xlarge`, `size_for`). It runs in the worker process (the
only one with the GPU): the engine is created once per worker and driven synchronously through
the threadless `EngineCore` (`step()` until nothing is left), and what crosses back to the main
process are `Snapshot`s -- frozen dataclasses of Python scalars, tuples and the engine's own
plain event dataclasses -- at most `SNAPSHOT_HZ` a second, because every yield is pickled.

Off ZeroGPU `run_on_gpu` is the plain generator: the tests drive it directly as well.
"""

from __future__ import annotations

import itertools
import logging
import math
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace

from dgemma.errors import first_line
from dgemma.events import Event, RequestEvent
from dgemma.serving.zerogpu import enabled
from dgemma.settings import Settings, run_options

log = logging.getLogger(__name__)

SNAPSHOT_HZ = 6.0  # the page redraws a few times a second; more would only cost pickling
DEADLINE_FRACTION = 0.85  # stop starting work at this share of the GPU time asked for
TIME_UP = "stopped: this run's GPU time is used up"
# What one call may ask ZeroGPU for, in seconds (the Space's own limit may be lower).
MAX_DURATION_S = int(os.environ.get("DGEMMA_ZEROGPU_MAX_DURATION", "120"))
# A generous guess at one engine step at full batch on a ZeroGPU slice, plus start-up (the
# weights' move to the GPU on a cold worker): duration = START + steps x STEP, capped.
STEP_S = float(os.environ.get("DGEMMA_ZEROGPU_STEP_S", "0.2"))
START_S = 20.0


@dataclass(frozen=True)
class Job:
    """Everything one GPU call needs; pickled into the worker, so plain values only."""

    settings: Settings
    prompts: tuple[str, ...] = ()
    stream: bool = True  # per-step events (cards, the lesson's overview) or only the results
    canvas_length: int = 32  # the model's, for the duration estimate
    max_num_seqs: int = 32


@dataclass(frozen=True)
class Snapshot:
    """What the worker sends back: the events since the last snapshot."""

    pid: int  # the process that did the work
    events: tuple[Event, ...] = ()
    done: bool = False


def duration(job: Job) -> int:
    """Seconds to ask ZeroGPU for: from the call's prompts and settings, capped at MAX_DURATION_S."""
    settings = job.settings
    canvases = math.ceil(settings.max_new_tokens / max(1, job.canvas_length))
    batches = math.ceil(len(job.prompts) / max(1, job.max_num_seqs))
    steps = batches * canvases * settings.params.max_denoising_steps
    return int(min(MAX_DURATION_S, START_S + steps * STEP_S))


# ---------------------------------------------------------------- the worker's state

_model = None  # the LoadedModel installed by the main process before launch (on "cuda")
_config = None  # the main EngineConfig
_engine_core = None  # the EngineCore, created in the worker on its first call
_gpu_call = None  # on ZeroGPU: `_run` wrapped by spaces.GPU, made by install()
workload_size: str | None = None  # on ZeroGPU: the size install() asked for
_keys = itertools.count(1)


def install(loaded, config) -> None:
    """The main process hands over the model (already put on "cuda") and the engine settings.

    On ZeroGPU this also makes the one `spaces.GPU` call, asking for the smallest workload size
    that holds the model (`workload_size`): before launch, as spaces requires."""
    global _model, _config, _gpu_call, workload_size
    _model, _config = loaded, config
    if enabled() and _gpu_call is None:  # pragma: no cover - exercised by tests/test_zerogpu.py in a subprocess
        workload_size = size_for(loaded)
        log.info("ZeroGPU workload size: %s", workload_size)
        _gpu_call = spaces.GPU(duration=duration, size=workload_size)(_run)


def size_for(loaded) -> str:
    """The ZeroGPU workload size for a loaded model: `large` (half an RTX Pro 6000) when its
    weights as loaded, the runtime reserve and one request's sampler step fit there, else
    `xlarge` (the whole card); a model too large for both is refused with one sentence."""
    from dgemma import plan
    from dgemma.gpus import ZEROGPU_SIZES
    from dgemma.memory import format_bytes

    model = replace(plan.model_from_facts(loaded.facts()), weights_bytes=loaded.weight_bytes)
    size = plan.zerogpu_size(model)
    if size is None:
        largest = ZEROGPU_SIZES[-1]
        raise ValueError(f"{loaded.name} does not fit a ZeroGPU workload: its weights take "
                         f"{format_bytes(loaded.weight_bytes)}, the largest workload ({largest.zerogpu_size}) "
                         f"holds {format_bytes(largest.total_bytes)}")  # fmt: skip
    return size


def _loaded_here():
    """The model as this process sees it: its device is where its parameters are (not "cuda")."""
    device = next(_model.model.parameters()).device
    return _model if device == _model.device else replace(_model, device=device)


def _core():
    """This worker's engine, created on its first call: free memory is measured here, on the GPU."""
    from dgemma.engine import EngineCore

    global _engine_core
    if _engine_core is None:
        _engine_core = EngineCore(_loaded_here(), _config)
    return _engine_core


def _generate(job: Job) -> Iterator[Snapshot]:
    pid = os.getpid()
    core = _core()
    options = run_options(job.settings, _config.memory_budget)
    problem = core.check_options(options)
    if problem:
        raise ValueError(problem)
    subscriber = f"gpu-{next(_keys)}"
    mailbox = core.subscribe(subscriber, coalesce=False)  # every frame: the page records the run
    deadline = time.monotonic() + DEADLINE_FRACTION * duration(job)
    finished = False
    try:
        for i, prompt in enumerate(job.prompts):
            core.submit(prompt, job.settings.request_params(i), job.settings.max_new_tokens, subscriber=subscriber,
                        stream_steps=job.stream, options=options, **job.settings.request_canvas(i))
        yield Snapshot(pid, tuple(mailbox.poll(0.0)))  # the queued cards at once
        last = time.monotonic()
        timed_out = False
        while core.has_unfinished():
            if not timed_out and time.monotonic() >= deadline:
                timed_out = True  # what runs now stops; nothing new starts
                core.cancel_subscriber(subscriber, reason=TIME_UP)
            core.step()
            if time.monotonic() - last >= 1.0 / SNAPSHOT_HZ:
                last = time.monotonic()
                yield Snapshot(pid, tuple(mailbox.poll(0.0)))
        finished = True
        yield Snapshot(pid, tuple(mailbox.poll(0.0)), done=True)
    finally:
        # Closed early (Stop, a closed page): leave this warm worker's engine empty for the next call.
        if not finished:
            log.info("GPU call closed early: cancelled its unfinished requests")
        core.cancel_subscriber(subscriber, reason="stopped")
        while core.has_unfinished():
            core.step()
        core.unsubscribe(mailbox)


def _run(job: Job) -> Iterator[Snapshot]:
    """The GPU call's body; any failure becomes one sentence (spaces would show only its class name)."""
    from gradio.exceptions import Error

    try:
        yield from _generate(job)
    except Error:
        raise
    except Exception as err:  # noqa: BLE001 - the page gets a sentence, the log the traceback
        log.exception("the GPU call failed")
        text = first_line(err)
        raise Error(f"The GPU run failed: {text.rstrip('.')}.", print_exception=False) from None


if enabled():  # pragma: no cover - exercised by tests/test_zerogpu.py in a subprocess
    import spaces  # before anything touches CUDA, as spaces requires


def run_on_gpu(job: Job) -> Iterator[Snapshot]:
    """The GPU call: through spaces.GPU on ZeroGPU (once install() has made it), else the plain
    generator (the tests drive it directly as well)."""
    return (_gpu_call or _run)(job)


def final_events(events: list[Event], seen: dict[int, str], reason: str) -> list[RequestEvent]:
    """Final "cancelled" events for requests the worker stopped reporting on (Stop ends its loop)."""
    for e in events:
        if isinstance(e, RequestEvent):
            seen[e.request_id] = e.status
    open_ids = [rid for rid, status in seen.items() if status not in ("done", "cancelled", "error")]
    return [RequestEvent(rid, "cancelled", error=reason) for rid in open_ids]
