"""Refine on a card: the card names its row (and a compare card its side), and the server reads the
prompt, seed and first canvas's text off that run (a real-scale frame has no room to carry them)."""

from __future__ import annotations

import json

import pytest

from dgemma.errors import SettingsError
from dgemma.ui.board import fold
from dgemma.ui.canvas import refinable, refine_start
from dgemma.ui.generate.first_canvas import REFINE_NEEDS_A_CARD, finished_card, refine_request
from dgemma.ui.seek import Seeker
from test_recording import recorded  # noqa: F401  (a seeded run of the tiny model, 6 prompts, 2 canvases each)


def test_a_named_row_gets_its_prompt_seed_and_first_canvas_text_from_the_tabs_run(recorded):  # noqa: F811
    recording = recorded[0]
    length = recording.header["model"]["canvas_length"]
    views = [v for v in fold(recording.events()).requests.values() if refinable(v)]
    assert views
    for view in views:
        card = json.dumps({"request": view.index})
        assert refine_request(card, lambda row, run: finished_card(recording, Seeker(), row)) == (
            view.prompt, view.seed, refine_start(view, length))


def test_a_compare_card_is_read_off_its_sides_run(recorded):  # noqa: F811
    runs = {None: None, "a": None, "b": recorded[0]}  # only side B holds a run
    view = next(v for v in fold(recorded[0].events()).requests.values() if refinable(v))
    card = json.dumps({"request": view.index, "run": "b"})
    assert refine_request(card, lambda row, run: finished_card(runs[run], Seeker(), row))[:2] == (view.prompt, view.seed)
    with pytest.raises(SettingsError, match="Refine needs a finished card"):
        refine_request(json.dumps({"request": view.index, "run": "a"}), lambda row, run: finished_card(runs[run], Seeker(), row))


def test_a_row_on_a_tab_without_a_run_is_one_sentence():
    with pytest.raises(SettingsError, match="Refine needs a finished card"):
        refine_request(json.dumps({"request": 1}), lambda row, run: finished_card(None, Seeker(), row))


def test_a_row_the_run_does_not_have_is_one_sentence(recorded):  # noqa: F811
    with pytest.raises(SettingsError) as err:
        finished_card(recorded[0], Seeker(), 999)
    assert str(err.value) == REFINE_NEEDS_A_CARD


@pytest.mark.parametrize("text", ["", "[]", '"request"', '{"request": "x"}', '{"prompt": "a"}', "7",
                                  '{"request": 1, "run": "c"}', '{"request": 1, "run": ["a"]}'])
def test_a_malformed_refine_box_is_one_sentence(text):
    with pytest.raises(SettingsError, match="Refine needs a finished card"):
        refine_request(text, lambda row, run: ("a", 1, "b"))
