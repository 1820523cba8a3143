"""`--scheduler` on the command line, on the embedded model: a request's tokens alone and in a crowd,
tiled and untiled, are the same; its steps count the decoder forwards, corrector sweeps too."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import generate_json
from dgemma.generate import main
from dgemma.model.loading import DEFAULT_MODEL

pytestmark = pytest.mark.embedded
PROMPTS = ["count 12 to 20", "add 17+25", "reverse tidal", "sort 9 4 7 1"]


def run_json(capsys, *argv: str) -> list[dict]:
    if not (Path(DEFAULT_MODEL) / "config.json").is_file():
        pytest.skip("the embedded model is not in assets/model")
    return generate_json(capsys, "--model", DEFAULT_MODEL, *argv, "--max-new-tokens", "32")


@pytest.mark.parametrize("scheduler", [["block_refinement"], ["block_refinement", "--editing-threshold", "0.9"],
                                       ["discrete_ddim", "--corrector-steps", "1"]])  # fmt: skip
def test_a_schedulers_tokens_are_the_same_alone_and_in_a_crowd_tiled_and_untiled(capsys, scheduler):
    argv = ["--scheduler", *scheduler]
    alone = [run_json(capsys, *argv, "--prompt", p, "--seed", str(5 + i), "--max-num-seqs", "1", "--tiling", "off")[0]
             for i, p in enumerate(PROMPTS)]  # fmt: skip
    crowd = run_json(capsys, *argv, *sum((["--prompt", p] for p in PROMPTS), []), "--seed", "5", "--max-num-seqs", "4",
                     "--tiling", "1")
    assert [o["token_ids"] for o in alone] == [o["token_ids"] for o in crowd]
    assert [o["steps"] for o in alone] == [o["steps"] for o in crowd]


def test_a_bad_scheduler_is_one_line_and_exit_2(capsys):
    code = main(["--model", DEFAULT_MODEL, "--prompt", "x", "--scheduler", "ddpm"])
    _, err = capsys.readouterr()
    assert code == 2 and err.strip().splitlines()[-1].endswith(
        "Setting 'scheduler' must be one of entropy_bound, block_refinement, discrete_ddim, got 'ddpm'.")
