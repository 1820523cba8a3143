"""The compact frame: every canvas position as one character of state and confidence plus its
piece, the card's head, and nothing that did not change resent by Gradio's streaming diff."""

from __future__ import annotations

import math

from gradio.utils import diff

from dgemma.ui.board import fold
from dgemma.ui import compact
from dgemma.ui.compact import CELLS, LEVELS, SEP, TEXT_CHARS, frame, is_special, level, shown_piece


def confidence(entropy: float) -> float:
    """exp(-entropy): what a cell's level counts (1 for a certain position)."""
    return math.exp(-entropy) if math.isfinite(entropy) and entropy >= 0 else 0.0
from test_recording import recorded  # noqa: F401  (a seeded run of the tiny model, 6 prompts, 2 canvases each)


def decode(cell: str) -> tuple[str, int]:
    """(state, confidence level) of one cell character."""
    for state, chars in CELLS.items():
        if cell in chars:
            return state, chars.index(cell)
    raise AssertionError(f"not a cell: {cell!r}")


def test_no_two_cells_share_a_character_and_none_needs_escaping_in_json():
    chars = "".join(CELLS.values())
    assert len(set(chars)) == len(chars) == 3 * LEVELS
    assert all(c.isascii() and c.isprintable() and c not in '"\\' for c in chars) and SEP not in chars


def test_confidence_levels_span_flat_to_certain():
    assert [level(p) for p in (0.0, 0.03, 0.5, 0.99, 1.0, math.nan, -1.0)] == [0, 0, 8, 15, 15, 0, 0]


def test_a_denoising_canvas_is_one_cell_per_position_with_its_state_confidence_and_piece(recorded):  # noqa: F811
    recording = recorded[0]
    for step in range(recording.steps + 1):
        board = fold(recording.events(step))
        rows = {r["request"]: r for r in frame(board)["rows"]}
        for view in board.requests.values():
            row, live = rows[view.request_id], view.last_step
            if live is None:
                continue
            assert len(row["cells"]) == len(live.token_ids) and row["pieces"].split(SEP) == [shown_piece(p) for p in live.pieces]
            for cell, entropy, accepted in zip(row["cells"], live.entropy, live.accepted, strict=True):
                state = "committed" if live.converged else "accepted" if accepted else "noise"
                assert decode(cell) == (state, level(confidence(entropy))), (step, view.request_id)


def test_a_finished_request_shows_its_last_canvas_committed_by_each_tokens_probability(recorded):  # noqa: F811
    recording = recorded[0]
    board = fold(recording.events())
    length = recording.header["model"]["canvas_length"]
    for row, view in zip(frame(board, length)["rows"], board.requests.values(), strict=True):
        assert view.status == "done" and row["status"] == "done" and row["label"] == "done"
        start = (view.canvases - 1) * length
        assert row["pieces"].split(SEP) == [shown_piece(p) for p in view.committed_pieces[start:]]
        probs = [math.exp(lp) for lp in view.committed_logprobs[start:]]
        assert [decode(c) for c in row["cells"]] == [("committed", level(p)) for p in probs]
        assert row["text"] == view.committed_text and row["prompt"] == view.prompt and row["seed"] == view.seed


def test_the_committed_text_a_card_carries_is_its_end_and_says_it_was_clipped(recorded):  # noqa: F811
    board = fold(recorded[0].events())
    view = next(iter(board.requests.values()))
    view.committed_text = "x" * 5000 + "the end"
    text = frame(board)["rows"][0]["text"]
    assert len(text) == TEXT_CHARS and text.startswith("…") and text.endswith("the end")


def test_between_two_frames_gradios_streaming_diff_sends_only_the_rows_that_changed(recorded):  # noqa: F811
    recording = recorded[0]
    before, after = frame(fold(recording.events(2))), frame(fold(recording.events(3)))
    edits = diff(before, after)
    changed = {i for i, (a, b) in enumerate(zip(before["rows"], after["rows"], strict=True)) if a != b}
    assert changed and len(changed) < len(after["rows"])  # two requests still wait in the queue
    assert {path[1] for _, path, _ in edits if path[0] == "rows"} == changed
    assert all(len(path) <= 3 for _, path, _ in edits)  # a changed row's string is resent whole, never piece by piece


def test_a_finished_card_carries_its_first_canvas_to_pin_and_its_refine_mark(recorded):  # noqa: F811
    recording = recorded[0]
    board = fold(recording.events())
    length = recording.header["model"]["canvas_length"]
    for row, view in zip(frame(board, length)["rows"], board.requests.values(), strict=True):
        assert row["refine"] == 1
        first = row["first"].split(SEP)
        assert first == ["" if is_special(p) else p for p in view.committed_pieces[:length]]
        assert view.committed_text.startswith("".join(first).replace("▁", " "))


def test_past_the_pinnable_size_a_finished_card_carries_only_its_refine_mark(recorded, monkeypatch):  # noqa: F811
    monkeypatch.setattr(compact, "PINNABLE_POSITIONS", 0)  # as a batch of 32 x 256 is
    board = fold(recorded[0].events())
    length = recorded[0].header["model"]["canvas_length"]
    for row in frame(board, length)["rows"]:  # Refine's prompt and start text are the server's to read
        assert row["refine"] == 1 and "first" not in row
