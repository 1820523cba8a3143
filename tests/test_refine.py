"""Refine on a card: its view's `refine` event names the card's row, the view is the tab's or a compare
side's, and the server reads the prompt, seed and first canvas's text off that view's run (a
real-scale frame has no room to carry them)."""

from __future__ import annotations

import pytest

from dgemma.errors import SettingsError
from dgemma.ui.board import fold
from dgemma.ui.compact import refinable
from dgemma.ui.generate.first_canvas import REFINE_NEEDS_A_CARD, finished_card, refine_request, refine_start
from dgemma.ui.seek import Seeker
from test_recording import recorded  # noqa: F401  (a seeded run of the tiny model, 6 prompts, 2 canvases each)


def test_a_named_row_gets_its_prompt_seed_and_first_canvas_text_from_the_tabs_run(recorded):  # noqa: F811
    recording = recorded[0]
    length = recording.header["model"]["canvas_length"]
    views = [v for v in fold(recording.events()).requests.values() if refinable(v)]
    assert views
    for view in views:
        assert refine_request({"request": view.index}, None, lambda row, run: finished_card(recording, Seeker(), row)) == (
            view.prompt, view.seed, refine_start(view, length))


def test_a_compare_card_is_read_off_its_sides_run(recorded):  # noqa: F811
    runs = {None: None, "a": None, "b": recorded[0]}  # only side B holds a run
    view = next(v for v in fold(recorded[0].events()).requests.values() if refinable(v))
    held = lambda row, run: finished_card(runs[run], Seeker(), row)  # noqa: E731
    assert refine_request({"request": view.index}, "b", held)[:2] == (view.prompt, view.seed)
    with pytest.raises(SettingsError, match="Refine needs a finished card"):
        refine_request({"request": view.index}, "a", held)


def test_a_row_on_a_tab_without_a_run_is_one_sentence():
    with pytest.raises(SettingsError, match="Refine needs a finished card"):
        refine_request({"request": 1}, None, lambda row, run: finished_card(None, Seeker(), row))


def test_a_row_the_run_does_not_have_is_one_sentence(recorded):  # noqa: F811
    with pytest.raises(SettingsError) as err:
        finished_card(recorded[0], Seeker(), 999)
    assert str(err.value) == REFINE_NEEDS_A_CARD


@pytest.mark.parametrize("card, run", [(None, None), ([], None), ("request", None), ({"request": "x"}, None),
                                       ({"prompt": "a"}, None), (7, None), ({"request": 1}, "c")])
def test_a_malformed_refine_event_is_one_sentence(card, run):
    with pytest.raises(SettingsError, match="Refine needs a finished card"):
        refine_request(card, run, lambda row, run: ("a", 1, "b"))
