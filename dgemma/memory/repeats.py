"""Loops whose bodies allocate alike, counted by the transient tracker at the cost of one body.

A step on a CPU takes a tile's positions a cache group at a time (dgemma/sampling/primitives.py):
some 80 small ops a group, dozens of groups a tile. Under the tracker (the budgeted virtual
device) every op passes through a Python dispatch mode, microseconds each, which cost the step
5-7 % at vocab 32,768 (docs/benchmarks.md). But each group runs the same ops on the same shapes,
so it allocates the same bytes: the first group of each size is counted op by op (the sampler
keeps one `Repeats` for all its tiles, vocab chunks and steps: TileInputs.repeats), and the rest
run without the trackers, each tracker charged the first's peak for as long as the body runs,
then counting the storages the body hands on (`keep`), as it would have. A body whose peak
would not fit runs counted op by op, so it fails at its op, as it would have. The peak, the
limit and the out-of-memory are the same as when every op is counted.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch
from torch.utils._python_dispatch import _disable_current_modes, _get_current_dispatch_mode_stack

from dgemma.memory.tracker import TransientTracker, distinct_storages


def _trackers() -> list[TransientTracker]:
    """The active dispatch modes when every one is a tracker; none when another mode is among
    them (that one must see every op, so nothing is skipped)."""
    stack = _get_current_dispatch_mode_stack()
    return stack if all(isinstance(mode, TransientTracker) for mode in stack) else []


def _charge(trackers: list[TransientTracker], peaks: list[int], what: str) -> bool:
    """Charge each tracker its peak; False, with nothing charged, when one of them is refused."""
    for i, (tracker, peak) in enumerate(zip(trackers, peaks)):
        try:
            tracker.charge(peak, what)
        except torch.OutOfMemoryError:
            for charged, nbytes in zip(trackers[:i], peaks):
                charged.uncharge(nbytes)
            return False
    return True


class Repeats:
    """The bodies of one loop, keyed by size: `with repeats.body(size) as keep: ...; keep(*results)`.

    A body must allocate the same bytes whenever it runs at the same size, and hand on only what
    it passes to `keep` (fresh tensors; everything else it allocates is freed by its end)."""

    def __init__(self) -> None:
        self._peaks: dict[object, list[int]] = {}  # size -> each tracker's peak above its live at the body's start

    @contextlib.contextmanager
    def body(self, size: object, what: str = "a group of positions") -> Iterator[Callable[..., None]]:
        """Run one body of `size`; `what` names it in an out-of-memory over what it hands on."""
        trackers = _trackers()
        if not trackers:
            yield lambda *tensors: None
            return
        peaks = self._peaks.get(size)
        # The first body of a size, and one whose peak would not fit, run counted op by op: the
        # one that does not fit then fails at its op, with the peak it reached, as it always has.
        if peaks is None or len(peaks) != len(trackers) or not _charge(trackers, peaks, what):
            with self._measured(size, trackers):
                yield lambda *tensors: None
            return
        kept: list[torch.Tensor] = []
        try:
            with _disable_current_modes():
                yield lambda *tensors: kept.extend(tensors)
        finally:
            for tracker, peak in zip(trackers, peaks):
                tracker.uncharge(peak)
        for tracker in trackers:
            tracker.count(distinct_storages(kept), f"the results of {what}")

    @contextlib.contextmanager
    def _measured(self, size: object, trackers: list[TransientTracker]) -> Iterator[None]:
        starts = [(t.live, t.peak) for t in trackers]
        for tracker in trackers:
            tracker.peak = tracker.live
        try:
            yield
            self._peaks[size] = [t.peak - live for t, (live, _) in zip(trackers, starts)]
        finally:
            for tracker, (_, peak) in zip(trackers, starts):
                tracker.peak = max(tracker.peak, peak)
