"""Seeking a recording: the board at any step from the nearest keyframe, never from step 0. `Seeker`
keeps the board last shown and a copy every `every` steps it folds past, so a jump folds at most
`every` - 1 steps; a copy shares the views' immutable items (entropy points, step frames), and a
kept step boundary never moves, since the recording only grows after it."""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator

from dgemma.recording import Recording
from dgemma.ui.board import Board, fold, held_bytes

KEYFRAME_EVERY = 8  # steps between keyframes: a jump folds at most 7 steps


def copy_board(board: Board) -> Board:
    """A board that folding on never changes `board`, and the other way round: it and each request's
    view get lists and dicts of their own (their items, immutable, are shared)."""
    def own(item, shared: str = ""):
        twin = copy.copy(item)
        for name, value in vars(item).items():
            if isinstance(value, (list, dict)) and name != shared:
                setattr(twin, name, copy.copy(value))
        return twin

    twin = own(board, shared="requests")
    twin.requests = {rid: own(view) for rid, view in board.requests.items()}
    return twin


class Seeker:
    """The board of one recording at any step, for the views to draw.

    Gradio may run two of a tab's handlers at once (a tick and a slider release): a view takes the
    board last shown out of `_kept` (list.pop is atomic) and puts it back when drawn, so two views
    never fold into, or draw from, one board; keyframes are only ever copied from, never folded into.
    """

    def __init__(self, every: int = KEYFRAME_EVERY) -> None:
        self.every = every
        self._kept: list[tuple[Recording, int, int, Board]] = []  # (recording, step shown, events folded, board)
        self._recording: Recording | None = None
        self._frames: dict[int, Board] = {}  # a closed step, a multiple of `every` -> the board then
        self._keyframe_bytes = 0  # what the keyframes hold, counted as each is kept

    @property
    def keyframes(self) -> int:
        return len(self._frames)

    @contextlib.contextmanager
    def at(self, recording: Recording, step: int) -> Iterator[Board]:
        """The board of `recording` at `step`, for the body of the `with` to draw: continued from the
        board last shown or the keyframe below `step`, whichever is further, keeping a keyframe at
        every multiple of `every` it folds past that the recording has closed (a later TilePlan fixes it)."""
        if recording is not self._recording:
            self._recording, self._frames, self._keyframe_bytes = recording, {}, 0
        step = max(0, min(step, recording.steps))
        end = recording.end_of_step(step)
        kept, shown, folded, board = self._kept.pop() if self._kept else (None, 0, 0, None)
        if kept is not recording or folded > end:
            shown, folded, board = 0, 0, None
        below = max((k for k in self._frames if k <= step), default=0)
        if below and (board is None or recording.end_of_step(below) > folded):
            shown, folded, board = below, recording.end_of_step(below), copy_board(self._frames[below])
        board = board if board is not None else Board()
        for boundary in range(max(self.every, -(-shown // self.every) * self.every), min(step, recording.steps - 1) + 1,
                              self.every):
            if (stop := recording.end_of_step(boundary)) > folded:
                fold(recording.events_between(folded, stop), board)
                folded = stop
                if boundary not in self._frames:
                    self._keep(boundary, copy_board(board))
        fold(recording.events_between(folded, end), board)
        yield board
        self._kept[:] = [(recording, step, end, board)]

    def _keep(self, step: int, keyframe: Board) -> None:
        """Keep `keyframe`, counting what it holds that the keyframe below it does not (they share their
        entropy points and pieces)."""
        seen: set[int] = set()
        if (below := max((k for k in self._frames if k < step), default=0)):
            held_bytes(self._frames[below], seen)  # only to know what it holds
        self._keyframe_bytes += held_bytes(keyframe, seen)
        self._frames[step] = keyframe

    def held_bytes(self) -> int:
        """What the seeker holds beyond the recording (the cap on kept runs counts it): the keyframes,
        and the board last shown."""
        kept = list(self._kept)
        return self._keyframe_bytes + (held_bytes(kept[0][3]) if kept else 0)

    def index(self, recording: Recording) -> None:
        """Fold the whole recording once, keeping every keyframe: any later jump is then short."""
        with self.at(recording, recording.steps):
            pass
