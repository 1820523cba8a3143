"""`python -m dgemma.generate --start TEXT --pin POSITION=TEXT`, and the figures its --json quotes."""

from __future__ import annotations

import pytest

from conftest import run_generate_json
from dgemma.generate import main
from dgemma.recording import load

EMBEDDED = ["--max-new-tokens", "32", "--greedy"]  # the default model: the embedded one


def test_a_pinned_position_holds_its_token_in_the_output(capsys):
    code, lines, _ = run_generate_json(capsys, "--prompt", "add 12+34", "--prompt", "reverse hello", "--pin", "1=7",
                              "--pin", "0=5", *EMBEDDED)
    assert code == 0
    for row in lines[:-1]:
        assert row["text"][:2] == "57", row


def test_a_start_text_is_the_first_canvas_step_zero_state_in_the_recording(capsys, tmp_path):
    path = tmp_path / "run.jsonl"
    code, lines, _ = run_generate_json(capsys, "--prompt", "count 3 to 9", "--start", "3 4 5", "--record", str(path), *EMBEDDED)
    assert code == 0
    recording = load(path.read_bytes())
    first = next(e for e in recording.events() if getattr(e, "step", None) == 0 and e.canvas_index == 0)
    assert "".join(first.pieces[:5]) == "3 4 5"
    assert recording.header["settings"]["start"] == ["3 4 5"]
    assert recording.summary == lines[-1]["summary"]["metrics"]  # the end line quotes the run's figures


def test_json_rows_and_summary_quote_tokens_per_forward_and_the_step_shares(capsys):
    code, lines, _ = run_generate_json(capsys, "--prompt", "add 12+34", "--prompt", "count 3 to 9", *EMBEDDED)
    assert code == 0
    *rows, last = lines
    for row in rows:
        m = row["metrics"]
        assert m["decoder_forwards"] == row["steps"] and m["canvases"] == row["canvases"]
        assert m["tokens_per_forward"] == round(m["canvas_tokens"] / m["decoder_forwards"], 4)
        assert m["tokens"] == len(row["token_ids"]) and m["tokens_per_s"] > 0
        assert m["decoder_share"] + m["sampler_share"] == pytest.approx(1, abs=1e-3)
        assert m["peak_sampler_bytes"] > 0
    run = last["summary"]["metrics"]
    assert run["tokens"] == sum(len(r["token_ids"]) for r in rows)
    assert run["tokens_per_forward"] == round(sum(r["metrics"]["canvas_tokens"] for r in rows) / sum(r["steps"] for r in rows), 4)
    assert run["peak_sampler_bytes"] == max(p["peak_transient_bytes"] for p in last["summary"]["tile_plans"])


@pytest.mark.parametrize("argv, sentence", [
    (["--pin", "1=77"], "the pin at position 1 ('77') is not one token of the vocabulary (it is 2 tokens)"),
    (["--pin", "16=7"], "pin position 16 is outside the canvas (positions 0 to 15)"),
    (["--pin", "x=7"], "Setting 'pins': a pin's position must be a whole number from 0, got 'x'."),
    (["--pin", "7"], "--pin takes POSITION=TEXT (for example --pin 3=x), got '7'"),
    (["--pin", ""], "--pin takes POSITION=TEXT (for example --pin 3=x), got ''"),
    (["--start", "1 2 3 4 5 6 7 8 9"], "the start text is 17 tokens but the canvas holds 16; shorten it to the first canvas"),
])  # fmt: skip
def test_a_bad_pin_or_start_exits_2_with_one_line_before_anything_runs(capsys, argv, sentence):
    code = main(["--prompt", "add 1+2", *argv, "--json"])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert err == f"python -m dgemma.generate: error: {sentence}\n"
