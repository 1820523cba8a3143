"""The real backend: the loaded model and its one engine behind the UI's small interface.

One engine per loaded model. A run's tiling, memory budget and sampler step travel with its
requests as `RunOptions` (the engine runs one sampler step per distinct options over one shared
decoder batch); the lesson's three runs are such runs too. Each run
subscribes under a key of its own, so it sees exactly its requests' events and the tile plans of
the steps they took part in, and cancelling it touches nobody else's requests.
"""

from __future__ import annotations

import argparse
import itertools
import logging
from dataclasses import replace

import torch

from dgemma.engine import Engine, EngineConfig, EngineError
from dgemma.errors import first_line
from dgemma.events import Event, RequestEvent, TilePlan
from dgemma.memory import format_bytes, parse_size, resolve_device
from dgemma.model.download import DownloadProgress
from dgemma.model.loading import LoadedModel, ModelLoadError, load_model
from dgemma.recording import Recording
from dgemma.sampling import RunOptions
from dgemma.serving.backend import Output
from dgemma.serving.lesson_budget import lesson_model, suggest_budget
from dgemma.serving.inputs import Limits
from dgemma.settings import Settings, run_options

log = logging.getLogger(__name__)


class BackendError(RuntimeError):
    """The app cannot start: one sentence for the terminal."""


class EngineRun:
    """One call's requests on one engine, streamed through one subscription."""

    _keys = itertools.count(1)

    def __init__(self, engine: Engine, prompts: list[str], settings: Settings, options: RunOptions,
                 stream: bool = True, notice: str = ""):
        self.engine = engine
        self.notice = notice  # one sentence the page shows as a warning (e.g. the engine was restarted)
        self.key = f"run-{next(self._keys)}"
        self.size = len(prompts)
        self.plans: list[TilePlan] = []
        self.recording: Recording | None = None  # set by a reader that keeps the run (Run's contract)
        # Subscribe first: the "queued" events of the submits below must not be missed. Every frame
        # is kept (no coalescing): the reader drains the mailbox at each poll, and a recording wants them all.
        self.mailbox = engine.subscribe(self.key, coalesce=False)
        # All or none: holding the intake, the engine's next step takes the whole run at once (up to
        # max_num_seqs start together, so step 0 of a recording shows every canvas's random start).
        with engine.core.intake:
            self.handles = [
                engine.submit(p, settings.request_params(i), settings.max_new_tokens, subscriber=self.key,
                              stream_steps=stream, options=options, **settings.request_canvas(i))
                for i, p in enumerate(prompts)
            ]
        self._closed = False

    def poll(self, timeout: float) -> list[Event]:
        events = self.mailbox.poll(timeout)
        self.plans.extend(e for e in events if isinstance(e, TilePlan))
        if self.recording is not None:
            self.recording.extend(events)
        return events

    def cancel(self) -> None:
        """Stop: the engine cancels this run's unfinished requests; their final events still come."""
        self.engine.cancel_subscriber(self.key)

    def close(self) -> None:
        """The reader is gone (stream ended, page closed): cancel what is left and unsubscribe."""
        if not self._closed:
            self._closed = True
            self.engine.cancel_subscriber(self.key)
            self.engine.unsubscribe(self.mailbox)

    def results(self) -> tuple[list[Output], list[TilePlan]]:
        # Keep reading while waiting: the mailbox keeps a bounded number of unread tile plans.
        while not all(h.done for h in self.handles):
            self.poll(0.1)
        self.poll(0.0)
        outputs = []
        for h in self.handles:
            final: RequestEvent = h.result()
            outputs.append(Output(h.prompt, final.text, final.steps, h.seed,
                                  final.error or ("" if final.status == "done" else final.status),
                                  final.extra.get("metrics")))
        return outputs, list(self.plans)


class EngineBackend:
    """One engine over the loaded weights; every run, with any tiling, budget or step (the lesson's too), shares it."""

    def __init__(self, loaded: LoadedModel, config: EngineConfig, limits: Limits, budget_text: str | None):
        self.loaded = loaded
        self.config = config
        self.limits = limits
        self.max_num_seqs = config.max_num_seqs
        self.budget_text = budget_text
        self.lesson_model = lesson_model(loaded, config.max_num_seqs)
        try:
            self.engine = Engine(loaded, config).start()
        except EngineError as err:
            raise ValueError(f"{str(err)[:1].upper()}{str(err)[1:]}.") from None
        p = self.engine.default_params
        self.defaults = Settings(
            params=replace(p, seed=0, greedy=False),
            options=RunOptions(tiling="auto", sampler=self.config.sampler),  # memory_budget None: the server's
            # Two canvases by default: enough to watch a commit, short enough for a laptop.
            max_new_tokens=min(limits.max_new_tokens, 64),  # the CLI's default: same call, same tokens
        )

    def run_options(self, settings: Settings) -> RunOptions:
        """How a run's requests are laid out: its tiling, sampler step and memory budget (None: the server's)."""
        return run_options(settings, self.config.memory_budget)

    def start(self, prompts: list[str], settings: Settings, stream: bool = True) -> EngineRun:
        options = self.run_options(settings)
        engine = self.engine
        problem = engine.core.check_options(options) or settings.canvas_problem(
            len(prompts), self.loaded.canvas_length, engine.core.tokenize_text)
        if problem:
            raise ValueError(f"{problem[:1].upper()}{problem[1:]}.")
        notice = ""
        if not engine.alive:
            # The engine thread gave up after repeated deaths: report it, start a fresh one, serve on.
            notice = f"The engine had stopped ({engine.last_error or 'no reason given'}); it was restarted for this run."
            log.warning(notice)
            engine.restart()
        return EngineRun(engine, prompts, settings, options, stream, notice)

    def info(self) -> dict:
        return {
            **self.loaded.facts(), "max_num_seqs": self.max_num_seqs,
            "memory_budget": self.budget_text or "none",
            "lesson_budget": self.suggest_budget(min(16, self.max_num_seqs), False),
        }

    def suggest_budget(self, requests: int, real_scale: bool) -> str:
        return suggest_budget(self.lesson_model, requests, real_scale)

    def close(self) -> None:
        self.engine.shutdown(timeout=5)


def make_backend(args: argparse.Namespace, progress: DownloadProgress | None = None) -> EngineBackend:
    """Load the model named on the command line (`progress` follows a hub download) and start the main engine."""
    try:
        device = resolve_device(args.device)
        budget = parse_size(args.memory_budget) if args.memory_budget else None
        loaded = load_model(args.model, device=device, dtype=getattr(args, "dtype", None), memory_budget=budget,
                            progress=progress, load_format=getattr(args, "load_format", "auto"),
                            experts=getattr(args, "experts", "auto"))
        limits = Limits(max_prompts=args.max_prompts, max_new_tokens=args.max_new_tokens, max_queued=args.max_queued)
        config = EngineConfig(
            max_num_seqs=args.max_num_seqs, tiling="auto", memory_budget=budget,
            max_new_tokens=args.max_new_tokens, max_prompt_chars=limits.max_prompt_chars,
        )
        return EngineBackend(loaded, config, limits, format_bytes(budget) if budget else None)
    except (ModelLoadError, EngineError, ValueError, torch.OutOfMemoryError) as err:
        raise BackendError(first_line(err)) from None
