"""The API's `start` and `pins` settings and the figures it quotes, on a real `python app.py`.

One call gives the same tokens through the API and the CLI with a start and pins too; a pinned
position holds its token; a start text is the first canvas's step-0 state in the run file; a bad
piece or position is one sentence.
"""

from __future__ import annotations

import pytest
from gradio_client import Client
from gradio_client.exceptions import AppError

from app_server import MODEL_ARGS
from conftest import generate_json

pytestmark = pytest.mark.server  # the API against a launched app, checked against the CLI

PROMPTS = ["add 12+34", "count 3 to 9", "reverse hello"]
SETTINGS = {"seed": 5, "max_new_tokens": 32, "greedy": True}


@pytest.fixture(scope="module")
def client(app_server):
    return Client(app_server.url, verbose=False)


def test_start_and_pins_give_the_same_tokens_through_the_api_and_the_cli(client, capsys):
    settings = {**SETTINGS, "start": "3 4", "pins": {"0": "5", "1": "7"}}
    result = client.predict(PROMPTS, settings, api_name="/generate")
    rows = generate_json(capsys, *MODEL_ARGS, "--seed", "5", "--max-new-tokens", "32", "--greedy", "--start", "3 4",
                         "--pin", "0=5", "--pin", "1=7", *[a for p in PROMPTS for a in ("--prompt", p)])
    assert [o["text"] for o in result["outputs"]] == [r["text"] for r in rows]
    assert [o["steps"] for o in result["outputs"]] == [r["steps"] for r in rows]
    assert all(o["text"][:2] == "57" for o in result["outputs"])  # the pinned positions hold


def test_a_start_per_prompt_is_each_first_canvas_step_zero_state_in_the_run_file(client):
    from dgemma.recording import load

    starts = ["46", "3 4 5", "ol"]
    result = client.predict(PROMPTS, {**SETTINGS, "start": starts, "record": True}, api_name="/generate")
    recording = load(result["recording"])
    firsts = {}
    for event in recording.events():
        if getattr(event, "step", None) == 0 and event.canvas_index == 0:
            firsts.setdefault(event.request_id, event)
    for start, event in zip(starts, sorted(firsts.values(), key=lambda e: e.request_id), strict=True):
        assert "".join(event.pieces[: len(start)]) == start
    assert recording.summary == result["summary"]


def test_outputs_and_summary_quote_tokens_per_forward_and_the_step_shares(client):
    result = client.predict(PROMPTS, SETTINGS, api_name="/generate")
    for output in result["outputs"]:
        metrics = output["metrics"]
        assert metrics["decoder_forwards"] == output["steps"] and metrics["tokens_per_forward"] > 0
        assert metrics["decoder_share"] + metrics["sampler_share"] == pytest.approx(1, abs=1e-3)
    summary = result["summary"]
    assert summary["requests"] == 3 and summary["tokens"] == sum(o["metrics"]["tokens"] for o in result["outputs"])
    assert summary["tokens_per_s"] > 0 and summary["steps_per_canvas"] >= 1 and summary["peak_sampler_bytes"] > 0


@pytest.mark.parametrize("settings, sentence", [
    ({"pins": {"1": "77"}}, "Prompt 2: the pin at position 1 ('77') is not one token of the vocabulary (it is 2 tokens)."),
    ({"pins": {"16": "7"}}, "Prompt 2: pin position 16 is outside the canvas (positions 0 to 15)."),
    ({"start": ["a", "b"]}, "Setting 'start' has 2 entries for 3 prompts; give one value for every prompt or a list "
                            "with one per prompt."),
    ({"pins": [{"1": "7"}, {"1": "7"}, "x"]}, "Setting 'pins' must be an object of position: token text pairs, got str."),
])  # fmt: skip
def test_a_bad_pin_or_start_is_one_sentence(client, settings, sentence):
    # Prompt 1 is fine for every pin: the sentence names the first prompt the model cannot take.
    bad = {k: (v if k != "pins" or isinstance(v, list) else [{}, v, v]) for k, v in settings.items()}
    with pytest.raises(AppError) as error:
        client.predict(PROMPTS, {**SETTINGS, **bad}, api_name="/generate")
    assert str(error.value) == sentence
