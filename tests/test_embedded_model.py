"""The shipped model: loads from assets/ like any checkpoint, fits the budget, and really answers."""

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer, DiffusionGemmaForBlockDiffusion

from dgemma.embedded import corpus, eval as evaluation

pytestmark = pytest.mark.embedded  # the shipped model, loaded by transformers and by the CLIs

MODEL = Path(__file__).resolve().parent.parent / "assets" / "model"


@pytest.fixture(scope="module")
def model():
    torch.set_num_threads(1)
    return DiffusionGemmaForBlockDiffusion.from_pretrained(MODEL).eval()


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(MODEL)


def test_embedded_model_fits_in_40_megabytes():
    assert sum(f.stat().st_size for f in MODEL.iterdir()) <= 40_000_000


def test_embedded_model_loads_with_its_tokenizer_and_diffusion_defaults(model, tokenizer):
    assert model.config.canvas_length == 16
    assert model.lm_head.weight is model.model.decoder.embed_tokens.weight  # tied, as the architecture expects
    assert (tokenizer.pad_token_id, tokenizer.eos_token_id, tokenizer.bos_token_id) == (0, 1, 2)
    assert len(tokenizer) == model.config.text_config.vocab_size
    config = model.generation_config
    assert (config.pad_token_id, config.eos_token_id) == (0, 1)
    assert config.max_denoising_steps and config.sampler_config.entropy_bound > 0


def test_embedded_model_answers_heldout_prompts_exactly(model):
    examples = [ex for family in corpus.CHECKABLE for ex in corpus.heldout(family, 2)]
    config = evaluation.generation_config_for(model, evaluation.parse_args(["--model", str(MODEL)]))
    generations = evaluation.generate_transformers(MODEL, [ex.prompt for ex in examples], config, seed=0)
    assert [g.text for g in generations] == [ex.answer for ex in examples]
    assert any(len(g.canvases) > 1 for g in generations)  # the outer, canvas-by-canvas loop ran


def test_eval_json_prints_a_row_per_family_then_the_summary(capsys):
    assert evaluation.main(["--json", "--n", "2", "--families", "reverse", "prose"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [row["family"] for row in lines[:-1]] == ["reverse", "prose"]
    assert {"impl", "family", "n", "exact_match", "converged_fraction", "mean_steps"} <= lines[0].keys()
    assert "lexicon_fraction" in lines[1] and "summary" in lines[-1]


def test_eval_pins_reports_answers_with_a_right_and_a_wrong_token_pinned(capsys):
    assert evaluation.main(["--json", "--impl", "engine", "--n", "4", "--families", "add", "prose", "--pins"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    pinned = [row for row in lines if row.get("impl") == "engine-pinned"]
    assert [row["family"] for row in pinned] == ["add"]  # only checkable families have a right token
    row = pinned[0]
    assert row["n"] == 4 and row["pinned_wrong_held"] == 1.0  # a pin holds even when it is wrong
    assert 0 <= row["pinned_wrong_rest_correct"] <= 1 and 0 <= row["pinned_correct_exact_match"] <= 1


def test_eval_scores_the_engine_with_a_scheduler_and_its_steps(capsys):
    argv = ["--json", "--impl", "engine", "--n", "2", "--families", "add", "--scheduler", "discrete_ddim", "--steps", "8"]
    assert evaluation.main(argv) == 0
    *rows, summary = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert rows[0]["scheduler"] == summary["summary"]["scheduler"] == "discrete_ddim"
    assert 1 <= rows[0]["mean_steps"] <= 8


def test_eval_refuses_a_scheduler_for_transformers_with_exit_2(capsys):
    with pytest.raises(SystemExit) as exit_:
        evaluation.parse_args(["--scheduler", "block_refinement"])
    assert exit_.value.code == 2
    assert "runs on the engine only" in capsys.readouterr().err


def test_eval_rejects_a_bad_model_dir_with_exit_2(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        evaluation.parse_args(["--model", str(tmp_path)])
    assert exit_.value.code == 2
    assert "no config.json" in capsys.readouterr().err


def test_the_cli_notes_once_per_prompt_outside_the_task_families(capsys):
    from dgemma.generate import main

    code = main(["--prompt", "what is 2+2?", "--prompt", "add 12+34", "--prompt", "Hello, who are you?",
                 "--max-new-tokens", "16", "--json"])
    out, err = capsys.readouterr()
    assert code == 0
    notes = [line for line in err.splitlines() if ": note: " in line]
    assert len(notes) == 2 and "prompt 1 ('what is 2+2?')" in notes[0] and "prompt 3" in notes[1], err
    assert all("only knows its task families" in line for line in notes)
    rows = [json.loads(line) for line in out.splitlines()][:-1]
    assert [bool(r["warning"]) for r in rows] == [True, False, True]
