"""`python -m dgemma.generate`: JSON in input order, seeds S + i, one clear line on bad input."""

from __future__ import annotations

import json

import pytest

from conftest import run_generate_json
from dgemma.generate import main

FAST = ["--max-denoising-steps", "2", "--max-new-tokens", "32"]


def test_json_has_one_object_per_request_in_input_order_then_a_summary(capsys, tiny_model_dir):
    prompts = ["add 1+2", "reverse abc", "sort 3 1 2"]
    code, lines, err = run_generate_json(capsys, "--model", tiny_model_dir, *sum((["--prompt", p] for p in prompts), []),
                                "--seed", "10", *FAST)
    assert code == 0 and err == ""
    *objects, last = lines
    assert [o["prompt"] for o in objects] == prompts
    assert [o["seed"] for o in objects] == [10, 11, 12]
    for o in objects:
        assert {"prompt", "text", "token_ids", "steps", "canvases", "seed"} <= o.keys()
        assert 1 <= o["canvases"] <= 2 and o["steps"] == 2 * o["canvases"]
    summary = last["summary"]
    assert summary["requests"] == 3 and summary["wall_seconds"] > 0 and summary["canvas_tokens_per_s"] > 0
    assert summary["tile_plans"] and summary["tile_plans"][0]["num_decode"] == 3
    assert summary["engine"]["steps"] > 0 and summary["engine"]["preemptions"] == 0  # no budget: nothing preempted


def test_seeded_output_does_not_depend_on_batch_size_or_tiling(capsys, tiny_model_dir):
    argv = ["--model", tiny_model_dir, "--prompt", "add 1+2", "--prompt", "count 1 to 4", "--prompt", "add 5+5",
            "--seed", "3", *FAST]
    _, one_by_one, _ = run_generate_json(capsys, *argv, "--max-num-seqs", "1", "--tiling", "off")
    _, together, _ = run_generate_json(capsys, *argv, "--max-num-seqs", "3", "--tiling", "1")
    assert [o["token_ids"] for o in one_by_one[:-1]] == [o["token_ids"] for o in together[:-1]]


def test_prompts_file_skips_blank_lines(capsys, tiny_model_dir, tmp_path):
    path = tmp_path / "prompts.txt"
    path.write_text("add 1+1\n\nreverse xy\n", encoding="utf-8")
    code, lines, _ = run_generate_json(capsys, "--model", tiny_model_dir, "--prompts-file", str(path), *FAST)
    assert code == 0 and [o["prompt"] for o in lines[:-1]] == ["add 1+1", "reverse xy"]


def test_an_empty_prompt_is_refused_at_the_door_with_one_line_and_nonzero_exit(capsys, tiny_model_dir):
    # The page's and the API's words (dgemma/settings.py's make_request), before anything runs.
    code, lines, err = run_generate_json(capsys, "--model", tiny_model_dir, "--prompt", "add 1+2", "--prompt", "   ", *FAST)
    assert code == 2 and lines == []
    assert err == "python -m dgemma.generate: error: Prompt 2 is empty; write some text or remove it.\n"


def test_a_failed_request_exits_one_while_the_others_finish(capsys, tiny_model_dir):
    code, lines, err = run_generate_json(capsys, "--model", tiny_model_dir, "--prompt", "x" * 600, "--prompt", "add 1+2",
                                         *FAST)
    assert code == 1
    assert err.count("\n") == 1 and "positions" in err
    assert [o["status"] for o in lines[:-1]] == ["error", "done"]


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["--model", "/no/such/model"], "model path not found"),
        (["--t-min", "0.9", "--t-max", "0.5"], "Setting 't_max' (0.5) must not be below 't_min' (0.9)"),
        (["--tiling", "sometimes"], "Setting 'tiling' must be auto, off, or a tile size"),
        (["--memory-budget", "8 gigs"], "Setting 'memory_budget' must be a size such as 512MiB"),
        (["--memory-budget", "64KiB"], "for its weights but only"),
        (["--max-num-seqs", "0"], "at least 1"),
        (["--seed", "abc"], "Setting 'seed' must be a number, got 'abc'."),
        (["--stability-threshold", "9"], "Setting 'stability_threshold' must be between 0 and 8, got '9'."),
        (["--tiling", "9"], "Setting 'tiling' must be auto, off, or a tile size from 1 to 8, got '9'."),
        (["--sampler", "fast"], "Setting 'sampler' must be reference or chunked, got 'fast'."),
        (["--seed", str(2**63 - 1), "--prompt", "add 2+2"], "Setting 'seed' must be at most 9223372036854775806 for 2 prompts"),
    ],
    ids=["unknown-model", "t-max-below-t-min", "bad-tiling", "malformed-budget", "budget-below-weights", "zero-seqs",
         "bad-seed", "stability-above-history", "tile-above-max-num-seqs", "unknown-sampler", "no-room-for-seed-plus-i"],
)
def test_bad_start_up_input_exits_2_with_one_line(capsys, tiny_model_dir, argv, expected):
    model = [] if "--model" in argv else ["--model", tiny_model_dir]
    code = main([*model, "--prompt", "add 1+2", *argv])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and expected in err and "Traceback" not in err


def test_a_lone_t_min_is_judged_against_the_models_own_t_max(capsys, tiny_model_dir):
    """The early check (before loading) cannot know the model's t_max; the model's own config decides."""
    code, lines, _ = run_generate_json(capsys, "--model", tiny_model_dir, "--prompt", "add 1+2", "--t-min", "0.6", *FAST)
    assert code == 0 and lines[0]["status"] == "done"
    code = main(["--model", tiny_model_dir, "--prompt", "add 1+2", "--t-min", "0.9", *FAST])
    _, err = capsys.readouterr()
    assert code == 2 and "Setting 't_max' (0.8) must not be below 't_min' (0.9)." in err  # the model's t_max is 0.8


def test_the_cli_and_the_api_parser_say_the_same_sentence(capsys, tiny_model_dir):
    from dgemma.settings import Settings, parse_settings

    with pytest.raises(ValueError) as parsed:
        parse_settings({"confidence_threshold": "-1"}, Settings())
    code = main(["--model", tiny_model_dir, "--prompt", "add 1+2", "--confidence-threshold", "-1"])
    _, err = capsys.readouterr()
    assert code == 2 and err == f"python -m dgemma.generate: error: {parsed.value}\n"


def test_bench_engine_prints_one_json_object_per_bench_with_the_issue_keys(capsys, tiny_model_dir):
    from dgemma.bench.engine import main as bench_main

    code = bench_main(["--model", tiny_model_dir, "--requests", "3", "--staggered", "3", "--repeat", "1",
                       "--staggered-repeat", "1", "--max-denoising-steps", "2", "--max-new-tokens", "16", "--json"])
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert code == 0 and [r["bench"] for r in lines] == ["batch", "staggered"]
    for result in lines:
        assert {"engine_tokens_per_s", "baseline_tokens_per_s", "ratio", "p50_s", "p95_s"} <= result.keys()
        assert result["engine_tokens_per_s"] > 0 and result["baseline_tokens_per_s"] > 0


def test_a_real_checkpoint_never_gets_the_teaching_models_note(capsys, tiny_model_dir):
    code, lines, err = run_generate_json(capsys, "--model", tiny_model_dir, "--prompt", "what is 2+2?", *FAST)
    assert code == 0 and err == "" and lines[0]["warning"] == ""


def test_record_saves_the_run_as_the_apps_run_file(capsys, tiny_model_dir, tmp_path):
    from dgemma.recording import load
    from dgemma.ui.board import fold

    path = tmp_path / "run.jsonl"
    code, lines, err = run_generate_json(capsys, "--model", tiny_model_dir, "--prompt", "add 1+2", "--prompt", "reverse abc",
                                "--seed", "4", "--record", str(path), *FAST)
    assert code == 0 and err == ""
    recording = load(path.read_bytes())
    assert recording.header["prompts"] == ["add 1+2", "reverse abc"] and recording.header["seeds"] == [4, 5]
    assert recording.steps == len(lines[-1]["summary"]["tile_plans"]) > 0  # one step per sampler call
    board = fold(recording.events())
    assert [v.committed_text for v in board.requests.values()] == [o["text"] for o in lines[:-1]]
    assert all(v.last_step is None and v.status == "done" for v in board.requests.values())
    start = fold(recording.events(0))
    assert all(v.last_step.step == 0 for v in start.requests.values())  # every canvas's random start


def test_record_to_a_path_that_cannot_be_written_is_one_line_before_loading(capsys, tmp_path):
    code = main(["--prompt", "x", "--model", str(tmp_path / "no-such-model"), "--record", str(tmp_path / "no" / "run.jsonl")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "cannot write --record" in err
