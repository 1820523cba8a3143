"""Pure pieces of the UI: settings checks, the event fold, frame pacing, canvas HTML, figures.

Events come from the real engine on the embedded model (see `engine_events`), not hand-built.
"""

from __future__ import annotations

import math

import pytest

from dgemma.ui.settings import Limits, Settings, SettingsError, parse_prompts, parse_settings, prompts_from_text
from dgemma.ui.stream import frames
from dgemma.ui.board import Board

LIMITS = Limits(max_prompts=8, max_new_tokens=64, max_queued=16, max_prompt_chars=100)


# ---------------------------------------------------------------- settings: one clear sentence each


@pytest.mark.parametrize(
    "raw, words",
    [
        ({"seed": "abc"}, "must be a number"),
        ({"seed": -1}, "between 0"),
        ({"t_min": float("nan")}, "finite"),
        ({"t_max": float("inf")}, "finite"),
        ({"max_denoising_steps": 2.5}, "whole number"),
        ({"max_new_tokens": 10_000}, "between 1 and 64"),
        ({"t_min": 0.9, "t_max": 0.5}, "must not be below"),
        ({"greedy": "maybe"}, "true or false"),
        ({"tiling": "sometimes"}, "auto, off, or a tile size"),
        ({"tiling": 0}, "auto, off, or a tile size"),
        ({"model": "/etc/passwd"}, "Unknown setting"),
        ({"seed": [1]}, "must be a number"),
        ("seed=1", "must be an object"),
    ],
)
def test_bad_settings_are_one_sentence(raw, words):
    with pytest.raises(SettingsError) as err:
        parse_settings(raw, Settings(), LIMITS, max_num_seqs=8)
    message = str(err.value)
    assert words in message
    assert "\n" not in message and message.endswith(".")


def test_settings_use_cli_names_and_defaults():
    s = parse_settings({"max-new-tokens": "16", "seed": 7, "greedy": "true", "tiling": "4", "t_min": None},
                       Settings(), LIMITS, max_num_seqs=8)
    assert (s.max_new_tokens, s.seed, s.greedy, s.tiling, s.t_min) == (16, 7, True, "4", Settings().t_min)
    assert parse_settings(None, Settings(seed=3), LIMITS, 8).seed == 3


@pytest.mark.parametrize(
    "prompts, words",
    [
        ([], "at least one prompt"),
        (["ok"] * 9, "Too many prompts: 9 given, at most 8"),
        (["ok", "   "], "Prompt 2 is empty"),
        (["x" * 101], "characters long"),
        (["\ud800"], "not valid Unicode"),
        ([3], "must be a string"),
        ({"a": 1}, "list of strings"),
    ],
)
def test_bad_prompts_are_one_sentence(prompts, words):
    with pytest.raises(SettingsError, match=words):
        parse_prompts(prompts, LIMITS)


def test_prompts_fill_the_batch_by_cycling():
    assert prompts_from_text("a\n\n b\n", 5) == ["a", " b", "a", " b", "a"]
    assert prompts_from_text("a\nb\nc", 2) == ["a", "b", "c"]
    assert prompts_from_text("  \n", 4) == []


# ---------------------------------------------------------------- frame pacing


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_frames_coalesce_many_events_into_few_renders():
    """1000 events spread over 2 s of (fake) time give about 2 s x 6 Hz renders, not 1000."""
    from dgemma.events import RequestEvent

    clock = FakeClock()
    pending = [RequestEvent(i % 4, "running") for i in range(1000)] + [RequestEvent(i, "done") for i in range(4)]

    def poll(timeout):
        clock.now += min(timeout, 0.002) if timeout > 0 else 0.002  # 2 ms per event
        return [pending.pop(0)] if pending else []

    boards = list(frames(poll, lambda b: b.finished, hz=6.0, clock=clock))
    assert boards[-1].finished
    assert 8 <= len(boards) <= 14, len(boards)
    assert boards[-1].events == 1004  # every event folded, none dropped
