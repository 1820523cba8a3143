"""`python -m dgemma.plan` and the lesson's explorer: the sampler's peak on real GPUs, from meta calibrations."""

from __future__ import annotations

import dataclasses
import functools
import json

import plotly.graph_objects as go
import pytest
import torch

from dgemma import plan
from dgemma.sampling import LMHead, calibrate_tile, calibration_for, chunked_tile
from dgemma.sampling.chunked import MAX_CHUNK, choose_chunk_size
from dgemma.ui.charts import plan_figure
from dgemma.plan import plan_sentence
from dgemma.ui.lesson.explorer import plan_table
from app_server import ROOT

MiB, GiB = 1024**2, 1024**3
FIELDS = {
    "gpu", "gpu_bytes", "weights_bytes", "fits_weights", "free_bytes", "requests", "canvas_length", "vocab",
    "untiled_peak_bytes", "fits_untiled", "seed_group", "tile_size", "tiles", "tiled_peak_bytes", "chunked_peak_bytes",
}  # fmt: skip


@pytest.fixture(scope="module")
def rows() -> list[dict]:
    return plan.plan_rows()


def rows_of(rows: list[dict], gpu: str) -> list[dict]:
    return [r for r in rows if r["gpu"] == gpu]


def test_defaults_cover_the_issue_gpus_and_request_counts(rows):
    assert {r["gpu"] for r in rows} == {
        "T4 16 GB", "L4 24 GB", "A10G 24 GB", "L40S 48 GB", "A100 40 GB", "A100 80 GB", "H100 80 GB",
        "H200 141 GB", "RTX Pro 6000 96 GB", "ZeroGPU large 48 GB", "ZeroGPU xlarge 96 GB",
    }  # fmt: skip
    assert sorted({r["requests"] for r in rows}) == [1, 2, 4, 8, 16, 32, 64]
    assert all(r["canvas_length"] == 256 and r["vocab"] == 262_144 for r in rows)
    assert all(r["weights_bytes"] == 26 * 10**9 * 2 for r in rows)


def test_the_released_model_fits_zerogpus_xlarge_workload_only(rows):
    large, xlarge = rows_of(rows, "ZeroGPU large 48 GB"), rows_of(rows, "ZeroGPU xlarge 96 GB")
    assert not any(r["fits_weights"] for r in large)  # 48.4 GiB of weights in half a card (47.5 GiB)
    assert all(r["fits_weights"] and r["tile_size"] for r in xlarge)
    (at32,) = [r for r in xlarge if r["requests"] == 32]
    assert at32["tiles"] == 1 and at32["chunked_tiles"] == 1  # 32 requests in one sampler call
    assert plan.zerogpu_size(plan.RELEASED) == "xlarge"


def test_zerogpu_size_is_the_smallest_workload_that_holds_the_model():
    assert plan.zerogpu_size(dataclasses.replace(plan.RELEASED, weights_bytes=20 * GiB)) == "large"
    assert plan.zerogpu_size(dataclasses.replace(plan.RELEASED, weights_bytes=100 * GiB)) is None


def test_zerogpu_workloads_are_half_and_all_of_the_card_spaces_reports():
    import json
    from importlib.resources import files

    from dgemma.gpus import ZEROGPU_CARD_BYTES, ZEROGPU_SIZES

    configs = json.loads(files("spaces.zero").joinpath("configs.json").read_text())
    (card,) = [c for c in configs if c["model"].startswith("NVIDIA RTX PRO 6000")]
    assert card["memory"] == ZEROGPU_CARD_BYTES
    assert [(g.zerogpu_size, g.total_bytes) for g in ZEROGPU_SIZES] == [
        ("large", card["memory"] // 2), ("xlarge", card["memory"])]
    # spaces itself switches to xlarge above this many packed bytes: the released weights are above it
    assert card["xlarge_threshold"] < plan.RELEASED.weights_bytes


def test_seed_group_is_the_seeds_formula_row_by_row(rows):
    for r in rows:
        # The seed's own lines: bytes_per_req = CL * vocab * 4 * 10; budget = int(free * 0.5) // bytes_per_req
        bytes_per_req = r["canvas_length"] * r["vocab"] * 4 * 10
        expected = max(1, min(r["requests"], int(r["free_bytes"] * 0.5) // max(bytes_per_req, 1)))
        assert r["seed_group"] == expected, r
        assert r["seed_tiles"] == -(-r["requests"] // expected)


def test_untiled_16_requests_at_cl256_is_the_seeds_28672_mib_within_10_percent(rows):
    (row,) = [r for r in rows if r["gpu"] == "H200 141 GB" and r["requests"] == 16]
    assert abs(row["untiled_peak_bytes"] / MiB - 28_672) <= 0.10 * 28_672, row["untiled_peak_bytes"] / MiB
    assert plan.untiled_calibration(256, 262_144, 2816).copies_per_request == pytest.approx(7.0, abs=0.01)


def test_every_tiled_peak_is_at_most_half_of_free_where_the_weights_fit(rows):
    fitting = [r for r in rows if r["fits_weights"]]
    assert {r["gpu"] for r in fitting} == {"A100 80 GB", "H100 80 GB", "H200 141 GB", "RTX Pro 6000 96 GB",
                                          "ZeroGPU xlarge 96 GB"}
    for r in fitting:
        assert r["tiled_peak_bytes"] <= r["free_bytes"] / 2, r
        assert r["chunked_peak_bytes"] <= r["free_bytes"] / 2, r
        assert r["tile_size"] * r["tiles"] >= r["requests"] > r["tile_size"] * (r["tiles"] - 1)


def test_chunked_32_requests_stay_under_5_5_gib_at_cl256(rows):
    for r in rows:
        if r["requests"] == 32 and r["fits_weights"]:
            assert r["chunked_peak_bytes"] < 5.5 * GiB, r


def test_weights_that_do_not_fit_leave_nothing_free_and_nothing_tiled(rows):
    for r in rows_of(rows, "L4 24 GB"):
        assert not r["fits_weights"] and r["free_bytes"] == 0 and not r["fits_untiled"]
        assert r["tile_size"] is None and r["tiled_peak_bytes"] is None and r["chunked_peak_bytes"] is None


def test_untiled_runs_out_where_its_peak_exceeds_free(rows):
    h200 = rows_of(rows, "H200 141 GB")
    assert [r["fits_untiled"] for r in h200] == [True] * 6 + [False]  # 64 requests need 112 GiB of 90.6 free
    assert all(r["fits_untiled"] == (r["untiled_peak_bytes"] <= r["free_bytes"]) for r in rows)


@pytest.mark.parametrize("chunk", [4096, MAX_CHUNK])
def test_chunked_calibration_over_two_chunks_equals_the_whole_vocabulary(chunk):
    embed = torch.empty(262_144, 2816, dtype=torch.bfloat16, device="meta")
    step = functools.partial(chunked_tile, chunk_size=chunk)
    whole = calibrate_tile(step, 256, 262_144, embed, LMHead(embed, 30.0))
    assert calibration_for(plan.model_facts(plan.RELEASED, 1), impl="chunked", chunk=chunk) == whole


@pytest.mark.parametrize("requests,free", [(64, 90 * GiB), (64, 3 * GiB), (8, 40 * MiB)])
def test_the_plan_picks_the_chunk_the_sampler_picks(requests, free):
    model = plan.ModelSpec("small", 0, 64, 16_384, 256)
    embed = torch.empty(16_384, 256, dtype=torch.bfloat16, device="meta")
    expected = choose_chunk_size(16_384, 64, requests, free, embed, LMHead(embed, 30.0))
    assert plan.chunk_for(requests, free, model, 64) == expected


def test_json_prints_one_row_per_gpu_and_request_count_then_a_summary(capsys):
    assert plan.main(["--json"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(lines) == 11 * 7 + 1  # nine cards and ZeroGPU's two workload sizes
    assert all(FIELDS <= set(row) for row in lines[:-1])
    assert lines[-1]["summary"] and lines[-1]["copies_per_request"]["seed_assumed"] == 10
    assert lines[-1]["zerogpu_size"] == "xlarge"


def test_a_local_checkpoint_is_planned_from_its_config(capsys):
    assert plan.main(["--model", str(ROOT / "assets" / "model"), "--gpus", "t4", "--requests", "16", "--json"]) == 0
    row, closing = (json.loads(line) for line in capsys.readouterr().out.splitlines())
    assert (row["canvas_length"], row["vocab"], closing["hidden"]) == (16, 45, 128)
    assert 1_000_000 < row["weights_bytes"] < 3_000_000 and row["fits_untiled"]  # 1.09 M parameters in bf16


def test_the_table_ends_with_each_gpus_rows_read_in_the_explorers_sentence(capsys):
    assert plan.main(["--gpus", "h200", "l4"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [line for line in out if line.startswith("On ")] == [
        plan.plan_sentence(rows_of(plan.plan_rows(gpus=(gpu,)), gpu.label), plan.RELEASED.name)
        for gpu in (plan.gpu_arg("h200"), plan.gpu_arg("l4"))]


@pytest.mark.parametrize("argv", [
    ["--gpus", "v100"], ["--requests", "0"], ["--canvas-length", "x"], ["--reserve", "lots"], ["--bogus"],
    ["--model", "/no/such/checkpoint"], ["--model", "someone/not-cached-model"], ["--model", str(ROOT / "docs")],
])  # fmt: skip
def test_bad_flags_print_one_sentence_and_exit_nonzero(argv, capsys):
    with pytest.raises(SystemExit) as exit_:
        plan.main(argv)
    err = capsys.readouterr().err
    assert exit_.value.code != 0
    assert len(err.strip().splitlines()) == 1 and err.startswith("python -m dgemma.plan: error: "), err
    assert "Traceback" not in err


# --------------------------------------------------------------------------- the explorer's rendering


def test_explorer_figure_draws_four_ways_free_memory_and_the_untiled_oom(rows):
    spec = plan_figure(rows_of(rows, "H200 141 GB"))
    go.Figure(spec)  # a valid Plotly figure
    names = [t["name"] for t in spec["data"]]
    assert names[:4] == ["untiled (one tile)", "seed heuristic (×10 guess)", "calibrated tiling", "chunked step"]
    assert any(n.startswith("free memory: 90.6 GiB") for n in names)
    (oom,) = [t for t in spec["data"] if t["name"] == "untiled runs out of memory"]
    assert oom["x"] == [64] and oom["y"] == [pytest.approx(112.0, abs=0.01)]  # 7 copies x 64 x 256 MiB


def test_explorer_figure_says_so_when_the_weights_do_not_fit(rows):
    spec = plan_figure(rows_of(rows, "L4 24 GB"))
    go.Figure(spec)
    assert not any(t["name"].startswith("free memory") for t in spec["data"])
    assert "do not fit" in spec["layout"]["annotations"][0]["text"]
    assert spec["data"][2]["y"] == [None] * 7  # nothing tiled


def test_explorer_sentence_reads_the_chart(rows):
    l4 = plan_sentence(rows_of(rows, "L4 24 GB"), "the released model")
    assert l4.startswith("On an L4 24 GB the released model does not fit in bf16")
    h200 = plan_sentence(rows_of(rows, "H200 141 GB"), "the released model")
    assert "untiled runs out of memory at 64 requests" in h200
    assert "groups of 18" in h200 and "35 % of free" in h200  # 10 copies assumed, 7 held: 0.5 x 7/10
    assert h200.endswith(".") and h200.count(". ") == 0  # one sentence


def test_explorer_sentence_says_which_zerogpu_workload_holds_the_released_model(rows):
    large = plan_sentence(rows_of(rows, "ZeroGPU large 48 GB"), "the released model")
    assert large.startswith("On a ZeroGPU large 48 GB the released model does not fit in bf16")
    xlarge = plan_sentence(rows_of(rows, "ZeroGPU xlarge 96 GB"), "the released model")
    assert "calibrated tiling runs tiles of 32" in xlarge and "the chunked step runs 64 requests in one tile" in xlarge


def test_explorer_table_has_one_line_per_request_count(rows):
    table = plan_table(rows_of(rows, "A100 80 GB"))
    assert table.count("<tr>") == 1 + 7
    assert "56.00 GiB (OOM)" in table  # 32 requests untiled on 29.6 GiB free


def test_the_loaded_model_plans_as_its_checkpoint_directory_does(embedded_model):
    loaded = plan.model_from_facts(embedded_model.facts())
    from_dir = plan.resolve_model(str(ROOT / "assets" / "model"))
    assert (loaded.canvas_length, loaded.vocab_size, loaded.hidden_size) == (16, 45, 128)
    assert loaded.weights_bytes == from_dir.weights_bytes  # both in bf16, counted once where tied


def test_the_explorer_says_in_its_sentence_when_the_loaded_model_is_not_ready():
    from dgemma.ui.lesson.explorer import explore
    from dgemma.serving.loading import LoadingBackend
    from dgemma.settings import Limits

    loading = LoadingBackend(Limits(), 8, None)  # page first: the model has not loaded yet
    sentence = explore(loading, plan.GPUS[0].key, "loaded", 0)["sentence"]
    assert sentence.startswith("The model is still loading") and sentence.count(". ") == 0
    unknown = explore(loading, "no-such-gpu", "released", 0)["sentence"]
    assert unknown == "Unknown GPU 'no-such-gpu': choose one from the list."


def test_a_ddim_corrector_sweep_plans_smaller_tiles_than_the_entropy_bound():
    h200 = next(g for g in plan.GPUS if g.key == "h200")
    sample, tempered, sweep = (plan.plan_row(h200, 32, plan.RELEASED, row=row) for row in ("sample", "tempered", "sweep"))
    assert sample["tiles"] == tempered["tiles"] == 1 and sweep["tiles"] > 1  # 7 fp32 copies a request, not 2
    assert sweep["tiled_peak_bytes"] <= 0.5 * sweep["free_bytes"]  # the planner's share, whatever the row


def test_the_explorer_plans_for_the_chosen_schedulers_row():
    from dgemma.ui.lesson.explorer import explore
    from dgemma.serving.loading import LoadingBackend
    from dgemma.settings import Limits

    loading = LoadingBackend(Limits(), 8, None)
    sample = explore(loading, "h200", "released", 0, "sample")["table"]
    sweep = explore(loading, "h200", "released", 0, "sweep")["table"]
    assert "1 × 32" in sample and "2 × 16" in sweep


def test_the_explorer_names_the_embedded_model_in_words(embedded_model):
    from dgemma.engine import EngineConfig
    from dgemma.settings import Limits
    from dgemma.serving.engine_backend import EngineBackend
    from dgemma.ui.lesson.explorer import explore

    backend = EngineBackend(embedded_model, EngineConfig(max_num_seqs=4), Limits(), None)
    try:
        sentence = explore(backend, "h200", "loaded", 0)["sentence"]
    finally:
        backend.close()
    assert "after the weights of the embedded model and the reserve" in sentence
