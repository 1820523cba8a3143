"""Seeking a recording: the board at any step equals a fresh fold to it, whatever steps were shown
before, and a jump folds at most a keyframe's spacing of steps, never the run from step 0."""

from __future__ import annotations

import pytest

from dgemma.recording import Recording
from dgemma.ui.board import fold
from dgemma.ui.seek import Seeker, copy_board
from test_recording import recorded  # noqa: F401  (a seeded run of the tiny model, 6 prompts, 2 canvases each)


class CountingRecording(Recording):
    """A real recording that counts the events every fold reads from it."""

    read = 0

    def events_between(self, start: int, end: int):
        for event in super().events_between(start, end):
            self.read += 1
            yield event


def counting_copy(recording: Recording) -> CountingRecording:
    copy = CountingRecording(recording.header)
    copy.extend(recording.events())
    return copy


def test_the_board_at_any_step_equals_a_fresh_fold_whatever_was_shown_before(recorded):  # noqa: F811
    recording = recorded[0]
    last = recording.steps
    seeker = Seeker(every=2)
    # forward, back, jumps both ways, the same step twice, past both ends
    for step in [*range(last + 1), last - 1, 1, last, last, 0, 5, 3, 4, 7, 2, last + 5, -1]:
        with seeker.at(recording, step) as board:
            assert board == fold(recording.events(step)), step


def test_a_jump_after_indexing_folds_only_the_events_since_the_keyframe_below_it(recorded):  # noqa: F811
    recording = counting_copy(recorded[0])
    seeker = Seeker(every=3)
    seeker.index(recording)
    assert seeker.keyframes == (recording.steps - 1) // 3
    for step in [recording.steps - 1, 1, 7, 4, 6, 0]:
        recording.read = 0
        with seeker.at(recording, step) as board:
            read = recording.read
            assert board == fold(recording.events(step))
        base = step // 3 * 3  # the keyframe at or below the step (none below 3: a fold from the start)
        assert read == recording.end_of_step(step) - (recording.end_of_step(base) if base else 0), step


def test_folding_on_a_copy_of_a_board_leaves_the_board_as_it_was(recorded):  # noqa: F811
    recording = recorded[0]
    middle = fold(recording.events(3))
    copy = copy_board(middle)
    fold(recording.events_between(recording.end_of_step(3), recording.end_of_step(recording.steps)), copy)
    assert middle == fold(recording.events(3)) and copy == fold(recording.events())


def test_a_live_recording_is_seekable_while_it_grows_and_keeps_keyframes_only_of_closed_steps(recorded):  # noqa: F811
    recording = recorded[0]
    growing, seeker = Recording(recording.header), Seeker(every=2)
    for i, event in enumerate(recording.events()):
        growing.add(event)
        if i % 5 == 0:
            for step in (growing.steps, growing.steps // 2):
                with seeker.at(growing, step) as board:
                    assert board == fold(growing.events(step)), (i, step)
            assert seeker.keyframes <= max(0, growing.steps - 1) // 2


@pytest.mark.parametrize("every", [1, 4, 100])
def test_any_keyframe_spacing_gives_the_same_boards(recorded, every):  # noqa: F811
    recording = recorded[0]
    seeker = Seeker(every=every)
    for step in [recording.steps, 2, recording.steps - 1, 0, 3]:
        with seeker.at(recording, step) as board:
            assert board == fold(recording.events(step)), step
