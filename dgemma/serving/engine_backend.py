"""The backends over a loaded model: `EngineBackend` runs its one engine in this process (ZeroGPU's,
dgemma/serving/zerogpu.py, runs it in spaces' worker). Each run subscribes under a key of its own, so
it sees exactly its requests' events and cancelling it touches nobody else's requests."""

from __future__ import annotations

import argparse
import itertools
import logging

import torch

from dgemma.engine import Engine, EngineConfig, EngineError
from dgemma.errors import first_line, sentence
from dgemma.events import Event
from dgemma.memory import format_bytes, resolve_device
from dgemma.model.download import DownloadProgress
from dgemma.model.loading import LoadedModel, ModelLoadError, load_model
from dgemma.sampling import RunOptions
from dgemma.serving.backend import ModelBackend
from dgemma.settings import Limits, RunRequest, run_options

log = logging.getLogger(__name__)


class BackendError(RuntimeError):
    """The app cannot start: one sentence for the terminal."""


class EngineRun:
    """One call's requests on one engine, streamed through one subscription."""

    _keys = itertools.count(1)

    def __init__(self, engine: Engine, call: RunRequest, options: RunOptions, stream: bool = True,
                 notice: str = ""):
        self.engine = engine
        self.notice = notice  # one sentence the page shows as a warning (e.g. the engine was restarted)
        self.key = f"run-{next(self._keys)}"
        self.size = len(call.prompts)
        # Subscribe first: the "queued" events of the submits below must not be missed. Every frame
        # is kept (no coalescing): the reader drains the mailbox at each poll, and a recording wants them all.
        self.mailbox = engine.subscribe(self.key, coalesce=False)
        engine.submit_run(call, options, self.key, stream)
        self._closed = False

    def poll(self, timeout: float) -> list[Event]:
        return self.mailbox.poll(timeout)

    def cancel(self) -> None:
        """Stop: the engine cancels this run's unfinished requests; their final events still come."""
        self.engine.cancel_subscriber(self.key)

    def close(self) -> None:
        """The reader is gone (stream ended, page closed): cancel what is left and unsubscribe."""
        if not self._closed:
            self._closed = True
            self.engine.cancel_subscriber(self.key)
            self.engine.unsubscribe(self.mailbox)


class EngineBackend(ModelBackend):
    """One engine over the loaded weights; every run, with any tiling, budget or step (the lesson's too), shares it."""

    def __init__(self, loaded: LoadedModel, config: EngineConfig, limits: Limits, budget_text: str | None):
        super().__init__(loaded, config, limits, budget_text)
        try:
            self.engine = Engine(loaded, config).start()
        except EngineError as err:
            raise ValueError(sentence(str(err))) from None
        self.encode_text, self.encode_prompt = self.engine.tokenize_text, self.engine.tokenize  # under its lock

    def start(self, call: RunRequest, stream: bool = True) -> EngineRun:
        options = run_options(call.settings, self.config.memory_budget)
        self.check_budget(call, options)  # a budget too small: one sentence, nothing queued
        engine = self.engine
        notice = ""
        if not engine.alive:
            # The engine thread gave up after repeated deaths: report it, start a fresh one, serve on.
            notice = f"The engine had stopped ({engine.last_error or 'no reason given'}); it was restarted for this run."
            log.warning(notice)
            engine.start()
        return EngineRun(engine, call, options, stream, notice)

    def close(self) -> None:
        self.engine.shutdown(timeout=5)


def serving_config(args: argparse.Namespace) -> tuple[EngineConfig, Limits]:
    """The command line's engine settings and limits (app.py's flags; --memory-budget in bytes already)."""
    limits = Limits(max_prompts=args.max_prompts, max_new_tokens=args.max_new_tokens, max_queued=args.max_queued)
    return EngineConfig(max_num_seqs=args.max_num_seqs, tiling="auto", memory_budget=args.memory_budget), limits


def make_backend(args: argparse.Namespace, progress: DownloadProgress | None = None) -> EngineBackend:
    """Load the model named on the command line (`progress` follows a hub download) and start the main engine."""
    try:
        device = resolve_device(args.device)
        budget = args.memory_budget
        loaded = load_model(args.model, device=device, dtype=getattr(args, "dtype", None), memory_budget=budget,
                            progress=progress, load_format=getattr(args, "load_format", "auto"),
                            experts=getattr(args, "experts", "auto"))
        return EngineBackend(loaded, *serving_config(args), format_bytes(budget) if budget else None)
    except (ModelLoadError, EngineError, ValueError, torch.OutOfMemoryError) as err:
        raise BackendError(first_line(err)) from None
