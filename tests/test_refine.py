"""Refine on a card: its view's `refine` event names the card's row, and the server reads the prompt,
seed and first canvas's text off the run of that view (the tab's or a compare side's: a real-scale
frame has no room to carry them)."""

from __future__ import annotations

import pytest

from dgemma.errors import SettingsError
from dgemma.ui.board import fold
from dgemma.ui.compact import refinable
from dgemma.ui.generate_tab.first_canvas import REFINE_NEEDS_A_CARD, refine_request, refine_start
from dgemma.ui.seek import Seeker
from test_recording import recorded  # noqa: F401  (a seeded run of the tiny model, 6 prompts, 2 canvases each)


def test_a_named_row_gets_its_prompt_seed_and_first_canvas_text_from_the_tabs_run(recorded):  # noqa: F811
    recording = recorded[0]
    length = recording.header["model"]["canvas_length"]
    views = [v for v in fold(recording.events()).requests.values() if refinable(v)]
    assert views
    for view in views:
        assert refine_request({"request": view.index}, recording, Seeker()) == (
            view.prompt, {"seed": view.seed, "start": refine_start(view, length)})


def test_a_view_whose_run_the_memory_cap_took_says_so(recorded):  # noqa: F811
    with pytest.raises(SettingsError, match="removed"):
        refine_request({"request": 1}, None, Seeker(), "This tab's run was removed.")


def test_a_row_on_a_tab_without_a_run_is_one_sentence():
    with pytest.raises(SettingsError, match="Refine needs a finished card"):
        refine_request({"request": 1}, None, Seeker())


def test_a_row_the_run_does_not_have_is_one_sentence(recorded):  # noqa: F811
    with pytest.raises(SettingsError) as err:
        refine_request({"request": 999}, recorded[0], Seeker())
    assert str(err.value) == REFINE_NEEDS_A_CARD


@pytest.mark.parametrize("card", [None, [], "request", {"request": "x"}, {"prompt": "a"}, 7])
def test_a_malformed_refine_event_is_one_sentence(card, recorded):  # noqa: F811
    with pytest.raises(SettingsError, match="Refine needs a finished card"):
        refine_request(card, recorded[0], Seeker())
