"""The lesson's suggested budget for a loaded model, read from the memory ledger as a backend reads it
(`ModelBackend.suggest_budget`), for tests that drive an engine or a server without a backend of their own."""

from __future__ import annotations

from dgemma.examples import lesson_prompts
from dgemma.gpus import RELEASED_VOCAB
from dgemma.memory.ledger import budget_text
from dgemma.sampling import RunOptions, SamplingParams, call_ledger


def lesson_budget(loaded, requests: int, real_scale: bool = False, max_num_seqs: int | None = None) -> str:
    """The budget the lesson's tab suggests for `requests` at this scale, on an engine of `max_num_seqs`
    slots (default: `requests`), as the box shows it ("328MiB")."""
    facts = loaded.ledger_facts(max_num_seqs or requests)
    options = RunOptions(tiling="off", fail_on_oom=True, pad_vocab=RELEASED_VOCAB if real_scale else None)
    tokens = [len(loaded.encode(p)) for p in lesson_prompts(requests)]
    return budget_text(call_ledger(facts, tokens, SamplingParams(), loaded.canvas_length, options, RunOptions())[1])
