"""The one loop over an `EngineCore`, and the threadless engine of a caller with a process of its own.

vLLM runs one busy loop with different clients around it; so does this engine. `drive` is the only
place a core is stepped: the `Engine`'s thread steps through it between its waits for work, and
`CallDriver` (ZeroGPU's GPU call, which runs one call at a time in spaces' forked worker) steps each
call through it to its end, honouring a deadline by cancelling that call's requests.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator

from dgemma.engine.core import EngineConfig, EngineCore, EngineStep
from dgemma.events import Event
from dgemma.model.loading import LoadedModel
from dgemma.sampling import RunOptions
from dgemma.settings import RunRequest


def drive(core: EngineCore, deadline: float | None = None, subscriber: str | None = None,
          reason: str = "") -> Iterator[EngineStep]:  # fmt: skip
    """Step `core` until nothing is left unfinished, yielding each step's output (a caller may stop between
    two). At `deadline` (time.monotonic()) `subscriber`'s requests are cancelled with `reason`: what runs
    stops, nothing new starts, and the loop steps on until they have ended."""
    timed_out = False
    while core.has_unfinished():
        if deadline is not None and not timed_out and time.monotonic() >= deadline:
            timed_out = True
            core.cancel_subscriber(subscriber, reason=reason)
        yield core.step()


class CallDriver:
    """A threadless engine over `loaded` that runs one call at a time to its end (`run`), for a caller
    that owns its process: the core is built here, stepped by `drive`, and left empty after each call."""

    def __init__(self, loaded: LoadedModel, config: EngineConfig):
        self.core = EngineCore(loaded, config)
        self._keys = itertools.count(1)

    def run(self, call: RunRequest, options: RunOptions, stream: bool, deadline: float, reason: str,
            every_s: float) -> Iterator[tuple[tuple[Event, ...], bool]]:  # fmt: skip
        """(events since the last yield, done): the queued cards at once, then at most one batch of events
        every `every_s` seconds, then the rest with done. Past `deadline` its requests are cancelled with
        `reason`; closed early (Stop, a closed page), its unfinished requests are cancelled and stepped out."""
        core, subscriber = self.core, f"call-{next(self._keys)}"
        mailbox = core.subscribe(subscriber, coalesce=False)  # every frame: the page records the run
        try:
            core.submit_run(call, options, subscriber, stream)
            yield tuple(mailbox.poll(0.0)), False
            last = time.monotonic()
            for _ in drive(core, deadline, subscriber, reason):
                if time.monotonic() - last >= every_s:
                    last = time.monotonic()
                    yield tuple(mailbox.poll(0.0)), False
            yield tuple(mailbox.poll(0.0)), True
        finally:
            core.cancel_subscriber(subscriber, reason="stopped")
            for _ in drive(core):  # the engine left empty for the next call
                pass
            core.unsubscribe(mailbox)

    def has_unfinished(self) -> bool:
        return self.core.has_unfinished()
