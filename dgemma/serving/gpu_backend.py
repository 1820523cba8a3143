"""The main process's backend on ZeroGPU: every run is one call of `gpu_worker.run_on_gpu`.

The main process never runs the engine (it has no GPU, and `spaces` emulates CUDA there only on
the main thread): it turns a click, an API call or one of the lesson's runs into a `Job`, iterates the GPU call's
snapshots and hands their events to the page exactly as the threaded engine's mailbox does, so
cards and charts are rendered here as everywhere else. Stop sets a flag; the thread reading the
stream then closes the GPU generator, which ends the worker's loop at its next yield.
"""

from __future__ import annotations

import argparse
import threading
from collections.abc import Callable, Iterator
from dataclasses import replace

from dgemma.events import Event, RequestEvent, TilePlan
from dgemma.recording import Recording
from dgemma.serving import gpu_worker
from dgemma.serving.backend import Output
from dgemma.serving.gpu_worker import Job, Snapshot
from dgemma.serving.inputs import Limits
from dgemma.serving.lesson_budget import lesson_model, suggest_budget
from dgemma.settings import Settings

STOPPED = "stopped"


class GpuRun:
    """One call's requests, streamed from one GPU call (the `Run` the layout and the API read)."""

    def __init__(self, job: Job, call: Callable[[Job], Iterator[Snapshot]]):
        self.size = len(job.prompts)
        self.pid: int | None = None  # the worker process that did the work (the API reports it)
        self._stream = call(job)  # spaces schedules the GPU on the first next()
        self._stop = threading.Event()
        self._seen: dict[int, str] = {}  # request id -> last status
        self._plans: list[TilePlan] = []
        self._ended = False
        self._reading = threading.Lock()  # one thread drives the generator at a time
        self.recording: Recording | None = None  # set by a reader that keeps the run (Run's contract)

    def poll(self, timeout: float) -> list[Event]:
        """The next snapshot's events (blocks for at most one snapshot period of the worker)."""
        events = self._poll()
        if self.recording is not None:
            self.recording.extend(events)
        return events

    def _poll(self) -> list[Event]:
        with self._reading:
            if self._ended:
                return []
            if self._stop.is_set():
                return self._end(STOPPED)
            try:
                snapshot = next(self._stream)
            except StopIteration:
                return self._end(STOPPED)
            self.pid = snapshot.pid
            events = list(snapshot.events)
            self._plans.extend(e for e in events if isinstance(e, TilePlan))
            gpu_worker.final_events(events, self._seen, "")  # only records the statuses
            if snapshot.done:
                self._ended = True
                for _ in self._stream:  # to its end: spaces then releases the GPU as a call that finished
                    pass
            elif self._stop.is_set():  # closed while this thread waited for the worker
                events += self._end(STOPPED)
            return events

    def _end(self, reason: str) -> list[Event]:
        self._ended = True
        self._stream.close()  # GeneratorExit at the worker's next yield: its loop ends there
        return list(gpu_worker.final_events([], self._seen, reason))

    def cancel(self) -> None:
        """Stop (from another thread): the reading thread closes the GPU call at its next poll."""
        self._stop.set()

    def close(self) -> None:
        """The reader is gone: close the GPU call now, or, if a poll is waiting on it, right after."""
        self._stop.set()
        if self._reading.acquire(blocking=False):
            try:
                if not self._ended:
                    self._end(STOPPED)
            finally:
                self._reading.release()

    def results(self) -> tuple[list[Output], list[TilePlan]]:
        finals: dict[int, RequestEvent] = {}
        order: list[int] = []
        while not self._ended:
            for e in self.poll(0.0):
                if isinstance(e, RequestEvent):
                    if e.request_id not in finals:
                        order.append(e.request_id)
                    finals[e.request_id] = e
        outputs = []
        for rid in order:
            e = finals[rid]
            outputs.append(Output(e.prompt, e.text, e.steps, e.seed if e.seed is not None else 0,
                                  e.error or ("" if e.status == "done" else e.status), e.extra.get("metrics")))
        return outputs, list(self._plans)


class ZeroGpuBackend:
    """The Backend of dgemma/serving/backend.py with all GPU work in the one `spaces.GPU` call."""

    def __init__(self, loaded, config, limits: Limits, budget_text: str | None,
                 call: Callable[[Job], Iterator[Snapshot]] = gpu_worker.run_on_gpu):
        from dgemma.sampling import RunOptions, SamplingParams

        self.loaded = loaded
        self.config = config
        self.limits = limits
        self.max_num_seqs = config.max_num_seqs
        self.budget_text = budget_text
        self._call = call
        # Plain values, read before launch: after it spaces moves this process's weights to disk.
        # The device is the CPU's, as the simulation's worker runs there too (tests/test_zerogpu.py).
        self.lesson_model = lesson_model(loaded, config.max_num_seqs, device="cpu")
        p = SamplingParams.from_generation_config(getattr(loaded.model, "generation_config", None))
        self.defaults = Settings(
            params=replace(p, seed=0, greedy=False), options=RunOptions(sampler=config.sampler),
            max_new_tokens=min(limits.max_new_tokens, 64),
        )  # the engine's own defaults (dgemma/serving/engine_backend.py), read from the same config
        self._facts = {**loaded.facts(), "device": "cuda (ZeroGPU)"}  # plain values, read before launch

    def _job(self, settings: Settings, **fields) -> Job:
        return Job(settings, canvas_length=self.loaded.canvas_length, max_num_seqs=self.max_num_seqs, **fields)

    def start(self, prompts: list[str], settings: Settings, stream: bool = True) -> GpuRun:
        problem = settings.canvas_problem(len(prompts), self.loaded.canvas_length, self.loaded.encode_text)
        if problem:
            raise ValueError(f"{problem[:1].upper()}{problem[1:]}.")
        return GpuRun(self._job(settings, prompts=tuple(prompts), stream=stream), self._call)

    def suggest_budget(self, requests: int, real_scale: bool) -> str:
        return suggest_budget(self.lesson_model, requests, real_scale)

    def info(self) -> dict:
        return {**self._facts, "max_num_seqs": self.max_num_seqs, "memory_budget": self.budget_text or "none",
                "lesson_budget": self.suggest_budget(min(16, self.max_num_seqs), False),
                "note": f"Each Run is one batch on a borrowed GPU ({_workload()}at most {gpu_worker.MAX_DURATION_S} s); "
                        "visitors' runs wait in ZeroGPU's own queue."}

    def close(self) -> None:
        pass  # the workers belong to spaces; they end with this process


def _workload() -> str:
    size = gpu_worker.workload_size
    return f"a ZeroGPU {size} workload, " if size else ""


def make_zerogpu_backend(args: argparse.Namespace) -> ZeroGpuBackend:
    """Load the model in the main thread, put it on "cuda" (recorded by spaces, moved in each
    worker) and hand it to the GPU call: before launch, as ZeroGPU requires."""
    import torch

    from dgemma.engine import EngineConfig
    from dgemma.memory import format_bytes, parse_size
    from dgemma.model.loading import load_model, parse_dtype

    budget = parse_size(args.memory_budget) if args.memory_budget else None
    # Loaded on the CPU, run on CUDA: `auto` is CUDA's bf16 (the packed weights decide the workload size).
    loaded = load_model(args.model, device="cpu", dtype=parse_dtype(getattr(args, "dtype", None), torch.device("cuda")),
                        load_format=getattr(args, "load_format", "auto"))
    loaded.model.to("cuda")
    limits = Limits(max_prompts=args.max_prompts, max_new_tokens=args.max_new_tokens, max_queued=args.max_queued)
    config = EngineConfig(max_num_seqs=args.max_num_seqs, tiling="auto", memory_budget=budget,
                          max_new_tokens=args.max_new_tokens, max_prompt_chars=limits.max_prompt_chars)
    gpu_worker.install(loaded, config)
    return ZeroGpuBackend(loaded, config, limits, format_bytes(budget) if budget else None)
