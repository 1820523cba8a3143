"""The board: what one tab has seen of a run's events, folded into one small state. Views never draw
per event: they fold events as they arrive (cheap: the latest step of each request and one
mean-entropy point per step) and draw the board a few times a second."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from dgemma.events import FINAL, Event, RequestEvent, Status, StepEvent, TilePlan
from dgemma.sizes import object_bytes

# Keep the tile chart readable and its JSON small: only the most recent sampler calls.
MAX_PLANS = 240


@dataclass
class RequestView:
    """One request as a card shows it."""

    request_id: int
    index: int = 0  # 1-based position in the session's run: prompt i has seed S + i - 1
    prompt: str = ""
    seed: int | None = None
    status: str = "queued"  # queued | running | converged | done | cancelled | error
    committed_text: str = ""
    committed_pieces: list[str] = field(default_factory=list)  # one per committed token, from the step frames
    committed_logprobs: list[float] = field(default_factory=list)  # log p of each committed token
    canvases: int = 0  # canvases committed so far
    steps: int = 0  # denoising steps taken so far, all canvases
    steps_before_canvas: int = 0  # steps of the canvases already committed
    last_step: StepEvent | None = None
    # (steps taken by this request so far, mean entropy): one point per step frame seen. The
    # engine's mailbox may merge frames of a slow reader, so points can skip steps, but the
    # x value is always the true step count and a canvas's converged frame is never merged away.
    entropy_curve: list[tuple[int, float]] = field(default_factory=list)
    error: str = ""
    preemptions: int = 0  # times the engine sent it back to the queue to free memory (it restarts)
    metrics: dict | None = None  # the quoted figures of its final event (dgemma/metrics.py)


@dataclass
class Board:
    """Everything one session's page shows, in the order requests were submitted."""

    requests: dict[int, RequestView] = field(default_factory=dict)
    plans: list[TilePlan] = field(default_factory=list)
    plan_count: int = 0  # sampler calls seen in total (plans keeps only the latest MAX_PLANS)
    confidence_threshold: float | None = None
    events: int = 0  # events folded so far: lets the driver tell whether anything changed
    notes: dict[int, str] = field(default_factory=dict)  # request index (1-based) -> a note its card shows
    canvas_length: int = 0  # positions of a canvas, from the step frames (the first canvas's are pinnable)
    failure: str = ""  # the run failed outside any one request (fail_unfinished): the one sentence why

    @property
    def finished(self) -> bool:
        return bool(self.requests) and all(r.status in FINAL for r in self.requests.values())


def _view(board: Board, request_id: int) -> RequestView:
    view = board.requests.get(request_id)
    if view is None:
        view = board.requests[request_id] = RequestView(request_id, index=len(board.requests) + 1)
    return view


def _commit_pieces(view: RequestView, event: RequestEvent) -> None:
    """The committed canvas is the last step frame's draft (a converged frame is never merged
    away): keep its pieces, cut where the engine cut the canvas (at EOS or max_new_tokens)."""
    new = len(event.token_ids) - len(view.committed_pieces)
    step = view.last_step
    if new > 0 and step is not None and tuple(step.token_ids[:new]) == tuple(event.token_ids[-new:]):
        view.committed_pieces.extend(step.pieces[:new])
    if "logprobs" in event.extra:
        view.committed_logprobs = list(event.extra["logprobs"])


def apply(board: Board, event: Event) -> Board:
    """Fold one event into `board` (in place, for speed) and return it."""
    board.events += 1
    if isinstance(event, TilePlan):
        board.plans.append(event)
        board.plan_count += 1
        if len(board.plans) > MAX_PLANS:
            del board.plans[: len(board.plans) - MAX_PLANS]
    elif isinstance(event, StepEvent):
        view = _view(board, event.request_id)
        view.last_step = event
        view.steps = view.steps_before_canvas + event.step
        if event.step:  # step 0 is the random start: no model output to plot yet
            view.entropy_curve.append((view.steps, event.mean_entropy))
        if view.status not in FINAL:
            view.status = "converged" if event.converged else Status.RUNNING
        board.confidence_threshold = event.confidence_threshold
        board.canvas_length = len(event.token_ids)
    elif isinstance(event, RequestEvent):
        view = _view(board, event.request_id)
        if event.extra.get("preempted"):
            # Back in the queue with nothing kept: it restarts from its prompt (same seed, same tokens).
            view.committed_text, view.canvases, view.steps, view.steps_before_canvas = "", 0, 0, 0
            view.committed_pieces, view.committed_logprobs = [], []
            view.last_step, view.entropy_curve = None, []
            view.preemptions += 1
        if event.prompt:
            view.prompt = event.prompt
        if event.seed is not None:
            view.seed = event.seed
        if event.status in (Status.COMMITTED, Status.DONE) or event.text:
            view.committed_text = event.text
            view.canvases = event.canvases
            _commit_pieces(view, event)
        if event.steps:
            view.steps = max(view.steps, event.steps)
        if event.status == Status.COMMITTED:
            view.steps_before_canvas = event.steps
            # The converged canvas is now part of the text; the next canvas starts from noise.
            view.status = Status.RUNNING
            view.last_step = None
        elif event.status in (Status.QUEUED, Status.RUNNING, *FINAL):
            view.status = event.status
        if event.status == Status.DONE:
            view.last_step = None
        if event.error:  # an out-of-memory run's sentence is its notice's, said once: its cards keep their canvases
            view.error = "out of memory" if "oom" in event.extra else event.error
        if "metrics" in event.extra:
            view.metrics = event.extra["metrics"]
    return board


def fail_unfinished(board: Board, sentence: str) -> Board:
    """The run ended by a failure outside any one request: every card still open says why."""
    board.failure = sentence
    for view in board.requests.values():
        if view.status not in FINAL:
            apply(board, RequestEvent(view.request_id, Status.ERROR, error=sentence))
    return board


def fold(events: Iterable[Event], board: Board | None = None) -> Board:
    """A board from events: `fold(events)` is the pure form the tests use."""
    board = Board() if board is None else board
    for event in events:
        apply(board, event)
    return board


def held_bytes(board: Board, seen: set[int] | None = None) -> int:
    """What `board` holds in memory (the cap on kept runs counts it, dgemma/serving/held_runs.py),
    counted from its objects; its tile plans are the recording's and its pieces the detokenizer's or
    the recording's table's, counted there. `seen`: the ids of objects counted already (filled in:
    pass it on to count a next board's own objects only)."""
    seen = set() if seen is None else seen
    seen.update(map(id, board.plans))
    return object_bytes(board, seen, shared=(str,))
