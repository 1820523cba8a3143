"""The event stream: what the engine tells its consumers (UI, CLI, tests).

Plain frozen dataclasses of Python scalars and lists, so an event can cross threads,
be JSON-encoded (`dataclasses.asdict`: the API's `tile_plans`, the CLI's and a run file's) and be
compared in tests without touching torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum


@dataclass(frozen=True)
class TileSplit:
    """A tile that raised out-of-memory and was split in half and retried."""

    start: int  # first decode row of the failed tile
    size: int  # requests in the failed tile
    error: str  # the allocator's message, one line


@dataclass(frozen=True)
class TilePlan:
    """One sampler call: how the decode requests were grouped against free memory."""

    time: float  # time.time() when the call started
    impl: str  # sampler implementation: "reference" | "chunked"
    num_decode: int  # requests denoising in this call
    canvas_length: int
    vocab_size: int
    free_bytes: int  # free memory seen by the planner before the call
    budget_bytes: int | None  # the device's capacity (virtual budget or CUDA cap); None = whole device
    bytes_per_request: int  # calibrated transient bytes one request adds
    group: int  # planned requests per tile
    tiles: tuple[int, ...]  # sizes of the tiles actually run (after splits)
    peak_transient_bytes: int  # measured peak bytes the call allocated above its start
    splits: tuple[TileSplit, ...] = ()
    seconds: float = 0.0
    peak_measured: bool = True  # False: peak_transient_bytes is the calibrated estimate
    # What the engine held during the call, by the memory ledger's term (dgemma/memory/ledger.py's TERMS
    # keys: weights, engine_state, run_state, kv_caches): with the peak and free, the call's whole ledger.
    held: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class StepEvent:
    """One denoising step of one request."""

    request_id: int
    canvas_index: int  # 0-based: which canvas of this request is denoising
    step: int  # denoising steps taken on this canvas; 0 = its random start (all re-noised, entropy log(vocab))
    max_steps: int
    token_ids: tuple[int, ...]  # the argmax (draft) canvas after this step
    pieces: tuple[str, ...]  # token_ids decoded one by one, for display
    entropy: tuple[float, ...]  # per-position entropy of the temperature-scaled distribution
    accepted: tuple[bool, ...]  # positions that kept the sampled token (the rest were re-noised)
    mean_entropy: float
    confidence_threshold: float
    converged: bool  # stable and confident, or max steps reached: committed next step


class Status(str, Enum):
    """A request's status in its events (text equal to its value: "done" == Status.DONE, and str() and
    f-strings give "done" as StrEnum's do; StrEnum is Python 3.11's, and ZeroGPU runs 3.10)."""

    __str__ = str.__str__
    __format__ = str.__format__

    QUEUED = "queued"
    RUNNING = "running"
    COMMITTED = "committed"
    DONE = "done"
    CANCELLED = "cancelled"
    ERROR = "error"


@dataclass(frozen=True)
class RequestEvent:
    """A change in a request's life: queued, admitted, committed a canvas, finished, failed."""

    request_id: int
    status: Status
    text: str = ""  # committed text so far (the whole output when status == "done")
    token_ids: tuple[int, ...] = ()  # committed token ids so far
    canvases: int = 0  # canvases committed so far
    steps: int = 0  # denoising steps taken so far, all canvases
    error: str = ""  # one clear sentence when status == "error"
    seed: int | None = None
    prompt: str = ""
    extra: dict = field(default_factory=dict, compare=False)


Event = TilePlan | StepEvent | RequestEvent
FINAL = (Status.DONE, Status.CANCELLED, Status.ERROR)  # a request whose RequestEvent has one of these has ended
