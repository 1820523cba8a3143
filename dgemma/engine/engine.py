"""`Engine`: an `EngineCore` driven by its own thread (named `dgemma-engine`), restarted if it dies.

Failures stay local: if the thread dies, its running requests fail with the reason, waiting ones
stay queued, and a fresh thread takes over (up to `max_restarts` deaths in a row), so a server
keeps serving. Everything else is the core's: see dgemma/engine/core.py.
"""

from __future__ import annotations

import logging
import threading

from dgemma.engine.core import EngineConfig, EngineCore
from dgemma.engine.driver import drive
from dgemma.engine.mailbox import Mailbox
from dgemma.engine.requests import RequestHandle
from dgemma.errors import first_line
from dgemma.events import RequestEvent, Status
from dgemma.model.loading import LoadedModel
from dgemma.sampling import RunOptions, SamplingParams
from dgemma.sampling.start import CanvasStart
from dgemma.settings import RunRequest

log = logging.getLogger(__name__)

THREAD_NAME = "dgemma-engine"


class Engine:
    """Continuous batching over one loaded model on a thread; thread-safe submit / stream / cancel."""

    def __init__(self, loaded: LoadedModel, config: EngineConfig = EngineConfig()):
        self.core = EngineCore(loaded, config)
        self.loaded = loaded
        self.config = config
        self._thread: threading.Thread | None = None
        self._stopping = False
        self.last_error = ""
        self.deaths = 0
        self._deaths_in_a_row = 0

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> Engine:
        with self.core.intake:
            if self._thread is not None and self._thread.is_alive():
                return self
            self._stopping = False
            self.core.refusal = ""
            self._thread = threading.Thread(target=self._loop, name=THREAD_NAME, daemon=True)
            self._thread.start()
        return self

    def shutdown(self, timeout: float = 30.0) -> None:
        """Stop the thread; every unfinished request gets a final 'cancelled' event."""
        with self.core.intake:
            self._stopping = True
            self.core.refusal = "the engine has shut down; this request was not run"
            self.core.intake.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)
        self.core.cancel_everything("the engine shut down")
        self.core.subscribers.close_all()

    def __enter__(self) -> Engine:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.shutdown()

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    # ------------------------------------------------------------------ the core's API

    @property
    def stats(self) -> dict:
        return self.core.stats

    @property
    def memory(self):
        return self.core.memory

    def submit(self, prompt: str, params: SamplingParams | None = None, max_new_tokens: int = 64,
               subscriber: str | None = None, stream_steps: bool = True, options: RunOptions | None = None,
               start: CanvasStart | None = None) -> RequestHandle:
        """Queue one prompt (see `EngineCore.submit`; `start`: its first canvas, resolved)."""
        return self.core.submit(prompt, params, max_new_tokens, subscriber, stream_steps, options, start)

    def submit_run(self, call: RunRequest, options: RunOptions, subscriber: str | None,
                   stream_steps: bool) -> list[RequestHandle]:
        """Queue a checked call's prompts all or none (see `EngineCore.submit_run`)."""
        return self.core.submit_run(call, options, subscriber, stream_steps)

    def tokenize(self, prompt: str) -> list[int]:
        """A prompt's token ids as a request takes them; safe from any thread."""
        return self.core.tokenize(prompt)

    def tokenize_text(self, text: str) -> list[int]:
        """Output text's token ids (a start, a pin); safe from any thread."""
        return self.core.tokenize_text(text)

    def cancel(self, request_id: int, subscriber: str | None = None, reason: str = "") -> None:
        self.core.cancel(request_id, subscriber, reason)

    def cancel_subscriber(self, subscriber: str, reason: str = "") -> int:
        return self.core.cancel_subscriber(subscriber, reason)

    def subscribe(self, subscriber: str | None = None, tile_plans: bool = True, coalesce: bool = True) -> Mailbox:
        return self.core.subscribe(subscriber, tile_plans, coalesce)

    def unsubscribe(self, mailbox: Mailbox) -> None:
        self.core.unsubscribe(mailbox)

    def run_until_done(self, prompts: list[str], params: list[SamplingParams] | SamplingParams | None = None,
                 max_new_tokens: int = 64, options: RunOptions | None = None) -> list[RequestEvent]:
        """Blocking convenience: submit all prompts, return their final events in input order."""
        if not isinstance(params, list):
            params = [params] * len(prompts)
        self.start()  # a no-op when running; a blocking call must not wait on a stopped engine
        handles = [self.submit(p, q, max_new_tokens, stream_steps=False, options=options) for p, q in zip(prompts, params)]
        return [h.result() for h in handles]

    # ------------------------------------------------------------------ the thread

    def _loop(self) -> None:
        core = self.core
        try:
            while True:
                with core.intake:
                    while not (self._stopping or core.has_unfinished()):
                        core.intake.wait()
                    if self._stopping:
                        return
                for _ in drive(core):  # the one loop over a core (engine/driver.py), until nothing is left
                    self._deaths_in_a_row = 0
                    if self._stopping:
                        return
        except BaseException as err:  # noqa: BLE001 - the thread must report any death
            self._die(err)

    def _die(self, err: BaseException) -> None:
        reason = f"{type(err).__name__}: {first_line(err) if str(err).strip() else ''}"
        log.exception("engine thread died: %s", reason)
        self.last_error = reason
        self.deaths += 1
        self._deaths_in_a_row += 1
        self.core.fail_running(f"the engine failed while running this request ({reason})")
        if self.config.auto_restart and self._deaths_in_a_row <= self.config.max_restarts:
            # Restart on a fresh thread: waiting requests stay queued and run there.
            self._thread = None
            self.start()
            return
        with self.core.intake:
            # One step: submit refuses until start(), the queue is emptied (nothing may wait
            # forever), and this thread counts as gone, so a start() that comes before it has
            # finished failing the queue starts a fresh thread (nothing queued after is touched).
            self.core.refusal = f"the engine stopped after repeated failures ({reason}); restart it"
            stranded = self.core.take_unstarted()
            self._thread = None
        self.core.end_requests(stranded, Status.ERROR, f"the engine stopped ({reason}); this request never started")
