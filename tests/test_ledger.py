"""The memory ledger (dgemma/memory/ledger.py): what a run holds, computed in one place, equal to what the
engine and the sampler really hold, and a budget that cannot hold a run refused before anything runs."""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

import pytest
import torch

from dgemma.engine import EngineConfig, EngineCore
from dgemma.events import TilePlan
from dgemma.examples import lesson_prompts
from dgemma.gpus import RELEASED_VOCAB
from dgemma.memory.ledger import (
    HISTORY_DEPTH, Calibration, Ledger, ModelFacts, RunShape, refusal, run_ledger, sampler_state_bytes,
)  # fmt: skip
from dgemma.sampling import MAX_STABILITY, RunOptions, SamplerConfig, SamplingParams, TiledSampler, call_ledger
from dgemma.sampling.primitives import LMHead
from dgemma.units import format_bytes

ROOT = Path(__file__).resolve().parents[1]


def allocated_state(sampler, model_embedding: torch.Tensor) -> int:
    """The bytes of the tensors a sampler holds, less the model's own embedding (the weights') when it reads it."""
    tensors = [t for t in vars(sampler).values() if isinstance(t, torch.Tensor)]
    return sum(t.untyped_storage().nbytes() for t in tensors
               if t.untyped_storage().data_ptr() != model_embedding.untyped_storage().data_ptr())


@pytest.mark.parametrize("vocab", [None, RELEASED_VOCAB], ids=["model-vocab", "real-scale"])
def test_the_ledgers_sampler_state_is_what_a_built_sampler_allocates(embedded_model, vocab):
    loaded = embedded_model
    facts = loaded.ledger_facts(8)
    head = LMHead(loaded.model.lm_head.weight, loaded.model.final_logit_softcapping)
    sampler = TiledSampler(SamplerConfig(8, loaded.canvas_length, vocab or loaded.vocab_size, loaded.embed_weight,
                                         loaded.embed_scale, lm_head=head))
    assert sampler_state_bytes(facts, vocab) == allocated_state(sampler, loaded.embed_weight)


def test_the_ledgers_history_depth_is_the_samplers():
    assert HISTORY_DEPTH == MAX_STABILITY


def test_an_idle_engine_holds_the_weights_and_its_samplers_state_as_the_ledger_counts_them(embedded_model):
    core = EngineCore(embedded_model, EngineConfig(max_num_seqs=8))
    facts = embedded_model.ledger_facts(8)
    assert core.resident.by_term == dict(weights=facts.weight_bytes, engine_state=sampler_state_bytes(facts),
                                         run_state=0, kv_caches=0)


def test_every_call_of_a_run_holds_what_its_ledger_says_and_no_more_cache(embedded_model):
    """The lesson's real-scale run: each TilePlan's `held` is the ledger's terms (the caches at most its own)."""
    n, budget = 4, 400 * 2**20
    core = EngineCore(embedded_model, EngineConfig(max_num_seqs=n))
    options = RunOptions(tiling="auto", memory_budget=budget, fail_on_oom=True, pad_vocab=RELEASED_VOCAB)
    watch = core.subscribe(coalesce=False)
    prompts = lesson_prompts(n)
    for i, prompt in enumerate(prompts):
        core.submit(prompt, SamplingParams(max_denoising_steps=2, seed=i), embedded_model.canvas_length, options=options)
    while core.has_unfinished():
        core.step()
    plans = [e for e in watch.poll(0) if isinstance(e, TilePlan)]
    facts = embedded_model.ledger_facts(n)
    ledger, _ = call_ledger(facts, [len(embedded_model.encode(p)) for p in prompts], SamplingParams(),
                            embedded_model.canvas_length, options, core.default_options)
    assert plans and all(p.budget_bytes == budget for p in plans)
    for plan in plans:
        assert plan.held["weights"] == ledger.weights and plan.held["engine_state"] == ledger.engine_state
        assert plan.held["run_state"] == ledger.run_state == sampler_state_bytes(facts, RELEASED_VOCAB)
        assert 0 < plan.held["kv_caches"] <= ledger.kv_caches
        assert plan.free_bytes == budget - sum(plan.held.values())  # the sampler's free is the ledger's


def ledger_of(budget: int | None) -> Ledger:
    """A real-scale lesson of 16 requests on a model like the embedded one, from plain numbers."""
    model = ModelFacts(4 * 2**20, 16, 45, 128, "float32", 2048, 32)
    calibration = Calibration(16 * 2**20, 2**20, 16, RELEASED_VOCAB)
    return run_ledger(model, RunShape((10,) * 16, vocab_size=RELEASED_VOCAB), calibration, budget)


def test_a_budget_that_cannot_hold_one_request_a_tile_is_one_sentence_naming_each_term_and_the_budget_to_type():
    ledger = ledger_of(64 * 2**20)
    text = refusal(ledger, 328 * 2**20)
    assert not ledger.fits and "\n" not in text
    assert text.startswith("The memory budget of 64.0 MiB cannot hold this run: it needs ")
    for name, nbytes in ledger.terms():
        assert f"{name} ({format_bytes(nbytes)})" in text
    assert text.endswith("the suggested budget for 16 requests is 328MiB.")
    assert "cannot even hold the model weights" in refusal(ledger_of(2**20), 328 * 2**20)


def test_a_budget_that_holds_one_request_a_tile_is_not_refused_even_if_the_untiled_step_runs_out():
    fits = ledger_of(ledger_of(None).needed)
    assert fits.fits and refusal(fits, 0) == ""


# ------------------------------------------------------------------ the terms are added up in one place
TERM_NAMES = {  # the identifiers that name each term of the ledger, wherever they appear
    "reserve": re.compile(r"^reserve(_bytes)?$"),
    "weights": re.compile(r"^weights?(_bytes)?$|weight_bytes"),
    "sampler state": re.compile(r"state_bytes|^engine_state$|^run_state$"),
    "KV caches": re.compile(r"^kv_|cache_bytes|^kv_caches$"),
    "tile transient": re.compile(r"tile_bytes|^tile$|peak_transient"),
}
LEDGER = ROOT / "dgemma" / "memory" / "ledger.py"


def sums_of_terms(source: str) -> list[tuple[int, list[str]]]:
    """Every `a + b` in `source` whose operands name two or more of the ledger's terms: (line, the terms)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            names = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
            names |= {n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)}
            names |= {n.func.id for n in ast.walk(node) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
            terms = sorted(term for term, pattern in TERM_NAMES.items() if any(pattern.search(name) for name in names))
            if len(terms) >= 2:
                found.append((node.lineno, terms))
    return found


def test_weights_caches_sampler_state_and_the_tile_are_added_up_only_in_the_ledger():
    files = sorted((ROOT / "dgemma").rglob("*.py")) + [ROOT / "app.py"]
    found = {str(p.relative_to(ROOT)): hits for p in files if p != LEDGER and (hits := sums_of_terms(p.read_text()))}
    assert not found, f"the ledger's terms added up outside dgemma/memory/ledger.py: {found}"


def test_the_one_place_rule_catches_a_budget_added_up_beside_the_ledger():
    stray = "held = model.weight_bytes + state(vocab) + tokens * model.kv_bytes_per_token\nfree = calibration.tile_bytes(1) + 2\n"
    assert [line for line, _ in sums_of_terms(stray)] == [1]
    assert sums_of_terms(LEDGER.read_text())  # the ledger itself does add them


def test_a_budgeted_runs_tiles_chart_stacks_each_calls_ledger_up_to_its_budget():
    """The Generate tab's tiles chart, under a budget: what the engine held, the call's peak and what was left,
    stacked as the memory visualizer stacks them, reach the budget at every call; without one, the lines stay."""
    from dgemma.ui.charts import tile_figure
    from dgemma.units import MiB

    held = dict(weights=40 * MiB, engine_state=2 * MiB, run_state=8 * MiB, kv_caches=6 * MiB)
    plans = [TilePlan(float(i), "reference", 8, 16, 45, free_bytes=200 * MiB, budget_bytes=256 * MiB, bytes_per_request=MiB,
                      group=4, tiles=(4, 4), peak_transient_bytes=(30 + i) * MiB, held=held) for i in range(3)]
    stacked = [t for t in tile_figure(plans)["data"] if t.get("stackgroup") == "ledger"]
    assert [t["name"] for t in stacked] == ["the model weights", "the engine's sampler state", "this run's sampler state",
                                            "the KV caches", "peak transient (MiB)", "free memory (MiB)"]
    assert [round(sum(t["y"][i] for t in stacked), 3) for i in range(3)] == [256.0] * 3
    unbudgeted = [dataclasses.replace(p, budget_bytes=None) for p in plans]
    assert not any(t.get("stackgroup") for t in tile_figure(unbudgeted)["data"])
