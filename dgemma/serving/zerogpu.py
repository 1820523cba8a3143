"""Hugging Face ZeroGPU: every run (Run, the API, the lesson's) is one call of the single `spaces.GPU`
generator `run_on_gpu`, in spaces' forked worker, the only process with the GPU.

The mode is chosen by the variable ZeroGPU Spaces set (`SPACES_ZERO_GPU`), read as `spaces` reads it,
never by whether `spaces` imports (it is installed everywhere the tests run). Each decorated function
gets its own worker with its own copy of the weights, so there is exactly one, made by `install()`
before launch. The worker runs each call on the engine's `CallDriver` and sends back `Snapshot`s of plain values
at most SNAPSHOT_HZ a second, because every yield is pickled. The main process (`ZeroGpuBackend`)
never runs the engine: spaces emulates CUDA there only on its main thread. Off ZeroGPU `run_on_gpu`
is the plain generator, which the tests drive directly.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace

from dgemma.errors import first_line
from dgemma.events import FINAL, Event, RequestEvent, Status
from dgemma.serving.backend import ModelBackend
from dgemma.settings import RunRequest, run_options


def enabled() -> bool:
    """True on a ZeroGPU Space (or its simulation in tests/test_zerogpu.py)."""
    return os.environ.get("SPACES_ZERO_GPU", "").lower() in ("1", "t", "true")


if enabled():  # pragma: no cover - exercised by tests/test_zerogpu.py in a subprocess
    import spaces  # before anything touches CUDA, as spaces requires

log = logging.getLogger(__name__)

SNAPSHOT_HZ = 6.0  # the page redraws a few times a second; more would only cost pickling
DEADLINE_FRACTION = 0.85  # stop starting work at this share of the GPU time asked for
TIME_UP = "stopped: this run's GPU time is used up"
STOPPED = "stopped"
# What one call may ask ZeroGPU for, in seconds (the Space's own limit may be lower).
MAX_DURATION_S = int(os.environ.get("DGEMMA_ZEROGPU_MAX_DURATION", "120"))
# A generous guess at one engine step at full batch on a ZeroGPU slice, plus start-up (the
# weights' move to the GPU on a cold worker): duration = START + steps x STEP, capped.
STEP_S = float(os.environ.get("DGEMMA_ZEROGPU_STEP_S", "0.2"))
START_S = 20.0


@dataclass(frozen=True)
class Job:
    """Everything one GPU call needs; pickled into the worker, so plain values only."""

    call: RunRequest  # checked and resolved (make_request), first canvases included
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
    settings = job.call.settings
    canvases = math.ceil(settings.max_new_tokens / max(1, job.canvas_length))
    batches = math.ceil(len(job.call.prompts) / max(1, job.max_num_seqs))
    steps = batches * canvases * settings.params.max_denoising_steps
    return int(min(MAX_DURATION_S, START_S + steps * STEP_S))


# ---------------------------------------------------------------- the worker

_model = None  # the LoadedModel installed by the main process before launch (on "cuda")
_config = None  # the main EngineConfig
_engine_driver = None  # the engine (dgemma/engine/driver.py's CallDriver), created in the worker on its first call
_gpu_call = None  # on ZeroGPU: `_run` wrapped by spaces.GPU, made by install()
workload_size: str | None = None  # on ZeroGPU: the size install() asked for


def install(loaded, config) -> None:
    """The main process hands over the model (already put on "cuda") and the engine settings; on
    ZeroGPU this makes the one `spaces.GPU` call, with the smallest workload size that holds the model."""
    global _model, _config, _gpu_call, workload_size
    _model, _config = loaded, config
    if enabled() and _gpu_call is None:  # pragma: no cover - exercised by tests/test_zerogpu.py in a subprocess
        workload_size = size_for(loaded)
        log.info("ZeroGPU workload size: %s", workload_size)
        _gpu_call = spaces.GPU(duration=duration, size=workload_size)(_run)


def size_for(loaded) -> str:
    """`large` (half an RTX Pro 6000) when the weights as loaded, the runtime reserve and one request's
    sampler step fit there, else `xlarge`; a model too large for both is refused with one sentence."""
    from dgemma import plan
    from dgemma.gpus import ZEROGPU_SIZES
    from dgemma.memory import format_bytes

    size = plan.zerogpu_size(replace(plan.model_from_facts(loaded.facts()), weights_bytes=loaded.weight_bytes))
    if size is None:
        largest = ZEROGPU_SIZES[-1]
        raise ValueError(f"{loaded.name} does not fit a ZeroGPU workload: its weights take "
                         f"{format_bytes(loaded.weight_bytes)}, the largest workload ({largest.zerogpu_size}) "
                         f"holds {format_bytes(largest.total_bytes)}")  # fmt: skip
    return size


def _driver():
    """This worker's threadless engine, created on its first call: free memory is measured here, on the GPU.
    The model's device is where its parameters are (not "cuda")."""
    from dgemma.engine import CallDriver

    global _engine_driver
    if _engine_driver is None:
        device = next(_model.model.parameters()).device
        _engine_driver = CallDriver(_model if device == _model.device else replace(_model, device=device), _config)
    return _engine_driver


def _generate(job: Job) -> Iterator[Snapshot]:
    """The call stepped to its end by the engine's one loop, its events sent back at most SNAPSHOT_HZ a second."""
    pid, options = os.getpid(), run_options(job.call.settings, _config.memory_budget)  # checked in the main process
    deadline = time.monotonic() + DEADLINE_FRACTION * duration(job)
    done = False
    try:
        for events, done in _driver().run(job.call, options, job.stream, deadline, TIME_UP, 1.0 / SNAPSHOT_HZ):
            yield Snapshot(pid, events, done=done)
    finally:  # closed early (Stop, a closed page): the driver left this warm worker's engine empty
        if not done:
            log.info("GPU call closed early: cancelled its unfinished requests")


def _run(job: Job) -> Iterator[Snapshot]:
    """The GPU call's body; any failure becomes one sentence (spaces would show only its class name)."""
    from gradio.exceptions import Error

    try:
        yield from _generate(job)
    except Error:
        raise
    except Exception as err:  # noqa: BLE001 - the page gets a sentence, the log the traceback
        log.exception("the GPU call failed")
        raise Error(f"The GPU run failed: {first_line(err).rstrip('.')}.", print_exception=False) from None


def run_on_gpu(job: Job) -> Iterator[Snapshot]:
    """The GPU call: through spaces.GPU on ZeroGPU (once install() has made it), else the plain generator."""
    return (_gpu_call or _run)(job)


# ---------------------------------------------------------------- the main process


class GpuRun:
    """One call's requests, streamed from one GPU call. Stop sets a flag; the thread reading the
    stream then closes the GPU generator, which ends the worker's loop at its next yield."""

    def __init__(self, job: Job):
        self.size = len(job.call.prompts)
        self.pid: int | None = None  # the worker process that did the work (the API reports it)
        self._stream = run_on_gpu(job)  # spaces schedules the GPU on the first next()
        self._stop = threading.Event()
        self._open: set[int] = set()  # requests the worker has not ended
        self._ended = False
        self._reading = threading.Lock()  # one thread drives the generator at a time

    def poll(self, timeout: float) -> list[Event]:
        """The next snapshot's events (blocks for at most one snapshot period of the worker)."""
        with self._reading:
            return self._next()

    def _next(self) -> list[Event]:
        if self._ended:
            return []
        if self._stop.is_set():
            return self._end()
        try:
            snapshot = next(self._stream)
        except StopIteration:
            return self._end()
        self.pid = snapshot.pid
        events = list(snapshot.events)
        for e in events:
            if isinstance(e, RequestEvent):
                (self._open.discard if e.status in FINAL else self._open.add)(e.request_id)
        if snapshot.done:
            self._ended = True
            for _ in self._stream:  # to its end: spaces then releases the GPU as a call that finished
                pass
        elif self._stop.is_set():  # closed while this thread waited for the worker
            events += self._end()
        return events

    def _end(self) -> list[Event]:
        """Close the GPU call (GeneratorExit at the worker's next yield); its open requests, cancelled."""
        self._ended = True
        self._stream.close()
        ended, self._open = [RequestEvent(rid, Status.CANCELLED, error=STOPPED) for rid in sorted(self._open)], set()
        return ended

    def cancel(self) -> None:
        """Stop (from another thread): the reading thread closes the GPU call at its next poll."""
        self._stop.set()

    def close(self) -> None:
        """The reader is gone: close the GPU call now, or, if a poll is waiting on it, right after."""
        self._stop.set()
        if self._reading.acquire(blocking=False):
            try:
                if not self._ended:
                    self._end()
            finally:
                self._reading.release()


class ZeroGpuBackend(ModelBackend):
    """The Backend of dgemma/serving/backend.py with all GPU work in the one `spaces.GPU` call."""

    def __init__(self, loaded, config, limits, budget_text: str | None):
        # The device is the CPU's, as the simulation's worker runs there too (tests/test_zerogpu.py).
        super().__init__(loaded, config, limits, budget_text, device="cpu")
        self._facts = {**self._facts, "device": "cuda (ZeroGPU)"}

    def _job(self, call: RunRequest, stream: bool = True) -> Job:
        return Job(call, stream, canvas_length=self.loaded.canvas_length, max_num_seqs=self.max_num_seqs)

    def start(self, call: RunRequest, stream: bool = True) -> GpuRun:
        self.check_budget(call, run_options(call.settings, self.config.memory_budget))  # before a GPU is asked for
        return GpuRun(self._job(call, stream))

    def info(self) -> dict:
        workload = f"a ZeroGPU {workload_size} workload, " if workload_size else ""
        return {**super().info(), "note": f"Each Run is one batch on a borrowed GPU ({workload}at most "
                f"{MAX_DURATION_S} s); visitors' runs wait in ZeroGPU's own queue."}


def make_zerogpu_backend(args: argparse.Namespace) -> ZeroGpuBackend:
    """Load the model in the main thread, put it on "cuda" (recorded by spaces, moved in each
    worker) and hand it to the GPU call: before launch, as ZeroGPU requires."""
    import torch

    from dgemma.memory import format_bytes
    from dgemma.model.loading import load_model, parse_dtype
    from dgemma.serving.engine_backend import serving_config

    budget = args.memory_budget
    # Loaded on the CPU, run on CUDA: `auto` is CUDA's bf16 (the packed weights decide the workload size).
    loaded = load_model(args.model, device="cpu", dtype=parse_dtype(getattr(args, "dtype", None), torch.device("cuda")),
                        load_format=getattr(args, "load_format", "auto"))
    loaded.model.to("cuda")
    config, limits = serving_config(args)
    install(loaded, config)
    return ZeroGpuBackend(loaded, config, limits, format_bytes(budget) if budget else None)
