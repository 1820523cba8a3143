"""Seeking a recording: the board at any step from the nearest keyframe, never from step 0. `Seeker`
keeps the board last shown and a copy every `every` steps it folds past, so a jump folds at most
`every` - 1 steps; a copy shares the views' immutable items (entropy points, step frames), and a
kept step boundary never moves, since the recording only grows after it."""

from __future__ import annotations

import bisect
import contextlib
import copy
from collections.abc import Iterator

from dgemma.recording import Recording
from dgemma.ui.board import Board, RequestView, fold, held_bytes

KEYFRAME_EVERY = 8  # steps between keyframes: a jump folds at most 7 steps


def copy_view(view: RequestView) -> RequestView:
    """A view whose lists and dicts are its own (their items, immutable, are shared)."""
    twin = copy.copy(view)
    for name, value in vars(view).items():
        if isinstance(value, (list, dict)):
            setattr(twin, name, copy.copy(value))
    return twin


def copy_board(board: Board) -> Board:
    """A board that folding on never changes `board`, and the other way round."""
    twin = copy.copy(board)
    for name, value in vars(board).items():
        if isinstance(value, (list, dict)) and name != "requests":
            setattr(twin, name, copy.copy(value))
    twin.requests = {rid: copy_view(view) for rid, view in board.requests.items()}
    return twin


class Seeker:
    """The board of one recording at any step, for the views to draw.

    Gradio may run two of a tab's handlers at once (a tick and a slider release): a view takes the
    board last shown out of `_kept` (list.pop is atomic) and puts it back when drawn, so two views
    never fold into, or draw from, one board; keyframes are only ever copied from, never folded into.
    """

    def __init__(self, every: int = KEYFRAME_EVERY) -> None:
        self.every = every
        self._kept: list[tuple[Recording, int, Board]] = []  # (recording, events folded, board)
        self._recording: Recording | None = None
        self._keys: list[int] = []  # events folded at each keyframe, ascending
        self._boards: dict[int, Board] = {}  # events folded -> the board then (never folded into)
        self._keyframe_bytes = 0  # what the keyframes hold, counted as each is kept

    @property
    def keyframes(self) -> int:
        return len(self._keys)

    def _start(self, recording: Recording, end: int) -> tuple[int, Board]:
        """The furthest board at or before event `end`: the one last shown, a keyframe's copy, or a new one."""
        if recording is not self._recording:
            self._recording, self._keys, self._boards = recording, [], {}
            self._keyframe_bytes = 0
        try:
            kept, folded, board = self._kept.pop()
        except IndexError:
            kept, folded, board = None, 0, None
        if kept is not recording or folded > end:
            folded, board = 0, None
        i = bisect.bisect_right(self._keys, end) - 1
        if i >= 0 and (board is None or self._keys[i] > folded):
            folded = self._keys[i]
            board = copy_board(self._boards[folded])
        return folded, board if board is not None else Board()

    def _fold_to(self, recording: Recording, step: int, folded: int, board: Board) -> int:
        """Fold `board` from event `folded` to the end of `step`, keeping a keyframe at each boundary
        of a multiple of `every` steps that the recording has closed (a later TilePlan fixes it)."""
        first = -(-self._step_of(recording, folded) // self.every) * self.every
        for boundary in range(max(first, self.every), min(step, recording.steps - 1) + 1, self.every):
            end = recording.end_of_step(boundary)
            if end <= folded:
                continue
            fold(recording.events_between(folded, end), board)
            folded = end
            if end not in self._boards:
                self._keep(end, copy_board(board))
        end = recording.end_of_step(step)
        fold(recording.events_between(folded, end), board)
        return end

    @staticmethod
    def _step_of(recording: Recording, folded: int) -> int:
        """The last step whose state `folded` events contain (0 when none)."""
        lo, hi = 0, recording.steps
        while lo < hi:  # the first step whose end lies beyond `folded`
            mid = (lo + hi) // 2
            if recording.end_of_step(mid) > folded:
                hi = mid
            else:
                lo = mid + 1
        return lo

    @contextlib.contextmanager
    def at(self, recording: Recording, step: int) -> Iterator[Board]:
        """The board of `recording` at `step`, for the body of the `with` to draw."""
        step = max(0, min(step, recording.steps))
        folded, board = self._start(recording, recording.end_of_step(step))
        end = self._fold_to(recording, step, folded, board)
        yield board
        self._kept[:] = [(recording, end, board)]

    def _keep(self, end: int, keyframe: Board) -> None:
        """Keep `keyframe` (the board after `end` events), counting what it holds that the keyframe
        below it does not: a keyframe shares its entropy points and pieces with the one before."""
        i = bisect.bisect_left(self._keys, end)
        seen: set[int] = set()
        if i:
            held_bytes(self._boards[self._keys[i - 1]], seen)  # only to know what it holds
        self._keyframe_bytes += held_bytes(keyframe, seen)
        self._boards[end] = keyframe
        self._keys.insert(i, end)

    def held_bytes(self) -> int:
        """What the seeker holds beyond the recording (the cap on kept runs counts it): the keyframes,
        and the board last shown."""
        kept = list(self._kept)
        return self._keyframe_bytes + (held_bytes(kept[0][2]) if kept else 0)

    def index(self, recording: Recording) -> None:
        """Fold the whole recording once, keeping every keyframe: any later jump is then short."""
        with self.at(recording, recording.steps):
            pass
