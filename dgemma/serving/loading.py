"""Page first: a Backend that answers while the model loads on a thread of its own. Until then every
run says "the model is still loading" in one sentence and `state()` says how far it has come (a hub
download in bytes); a load that fails stays reported (page and API) until the process exits."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from dgemma.errors import first_line, sentence
from dgemma.model.download import DownloadProgress
from dgemma.model.source import is_embedded, public_name
from dgemma.serving.backend import Backend, LoadState, Run
from dgemma.settings import CanvasModel, Limits, RunRequest, Settings, make_request


class LoadingBackend:
    """Stands in for the real backend until `load()` (run on a thread) has built it."""

    def __init__(self, limits: Limits, max_num_seqs: int, budget_text: str | None, model: str | None = None):
        self.limits = limits
        self.model = model  # what was asked for: the examples fit it before it has loaded
        self.max_num_seqs = max_num_seqs
        self.budget_text = budget_text
        self.defaults = Settings(max_new_tokens=min(limits.max_new_tokens, 64))  # the model's come at ready
        self.loaded = threading.Event()  # set when the load ended, either way
        self._real: Backend | None = None
        self.error = ""  # the load's failure, one sentence
        self._stage = "starting"
        self.download = DownloadProgress()  # the loader passes it to load_model for a hub checkpoint
        self._started = time.monotonic()
        self.on_ready: Callable[[], None] = lambda: None  # run once the real backend answers (the page settles)

    def load(self, build: Callable[[Callable[[str], None]], Backend]) -> None:
        """On the loader thread: run `build(report_stage)`; keep its backend (then `on_ready()`), or its error's first
        line as the failure."""
        try:
            real = build(lambda stage: setattr(self, "_stage", stage))
        except Exception as err:  # noqa: BLE001 - any failure is shown as one sentence, never a traceback
            self.error = sentence(first_line(err))
        else:
            self._real = real
            self.defaults = real.defaults
            self.on_ready()
        finally:
            self.loaded.set()

    def state(self) -> LoadState:
        if self._real is not None:
            return LoadState(True, False, "")
        if self.error:
            return LoadState(False, True, f"The model failed to load: {self.error}")
        seconds = time.monotonic() - self._started
        stage = self.download.describe() or self._stage
        return LoadState(False, False, f"Loading model … ({seconds:.0f} s): {stage}.")

    def _real_one(self) -> Backend:
        if self._real is None:
            raise ValueError(f"The model failed to load: {self.error}" if self.error else
                             "The model is still loading; try again when the page says it is ready.")
        return self._real

    def request(self, prompts: Any, raw: Any) -> RunRequest:
        """The real backend's request; before it is built, the call's own mistakes first, then the loading sentence."""
        if self._real is None:
            make_request(prompts, raw, self.defaults, self.limits, self.max_num_seqs, self.canvas_model)
        return self._real_one().request(prompts, raw)

    def canvas_model(self) -> CanvasModel:
        return self._real_one().canvas_model()

    def start(self, call: RunRequest, stream: bool = True) -> Run:
        return self._real_one().start(call, stream)

    def suggest_budget(self, requests: int, real_scale: bool) -> str:
        if self._real is None:
            return "256MiB"  # replaced by the model's own suggestion when it is ready
        return self._real.suggest_budget(requests, real_scale)

    def info(self) -> dict[str, Any]:
        if self._real is None:
            return {"model": public_name(self.model), "embedded": is_embedded(self.model),
                    "memory_budget": self.budget_text or "none", "lesson_budget": self.suggest_budget(16, False)}
        return self._real.info()

    def close(self) -> None:
        if self._real is not None:
            self._real.close()
