"""The memory ledger's terms (dgemma/memory/ledger.py) for three models, as docs/tiling.md shows them:
the embedded model (the lesson's 16 requests, at its vocabulary and at real scale), the structure twin
of the release (tests/twin.py, random weights, canvas 256, vocab 262,144, on this CPU in fp32), and the
released checkpoint on one H200 in bf16 (its published size; 32 requests of 100 prompt tokens).

    python scripts/ledger_terms.py
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from dgemma.examples import lesson_prompts  # noqa: E402
from dgemma.gpus import GPUS, RELEASED_VOCAB  # noqa: E402
from dgemma.memory.ledger import Ledger, ModelFacts, RunShape, budget_text, run_ledger, suggested_budget  # noqa: E402
from dgemma.sampling import calibration_for  # noqa: E402
from dgemma.units import format_bytes  # noqa: E402


def show(title: str, facts: ModelFacts, shape: RunShape, budget: int | None = None, reserve: int = 0) -> None:
    calibration = calibration_for(facts, shape.vocab_size)
    n = len(shape.prompt_tokens)
    untiled = run_ledger(facts, shape, calibration, budget, tile_requests=n, reserve=reserve)
    one = run_ledger(facts, shape, calibration, budget, tile_requests=1, reserve=reserve)
    print(f"{title}: {n} requests, canvas {facts.canvas_length}, vocab {shape.vocab_size or facts.vocab_size:,}, "
          f"{facts.max_num_seqs} slots, {facts.embed_dtype} on {facts.device}")
    for name, nbytes in untiled.terms():
        print(f"  {name:<34} {format_bytes(nbytes):>11} {nbytes:>16,} B")
    print(f"  {'held (before the sampler call)':<34} {format_bytes(untiled.held):>11} {untiled.held:>16,} B")
    print(f"  {'one request a tile needs':<34} {format_bytes(one.needed):>11} {one.needed:>16,} B")
    print(f"  {'untiled needs':<34} {format_bytes(untiled.needed):>11} {untiled.needed:>16,} B")
    if budget is None:
        print(f"  the lesson's suggested budget: {budget_text(suggested_budget(facts, shape, calibration))}")
    else:
        print(f"  budget {format_bytes(budget)}: free for the sampler {format_bytes(untiled.free)}; "
              f"untiled {'fits' if untiled.fits else 'runs out of memory'}")


def main() -> int:
    from transformers import DiffusionGemmaConfig

    from dgemma.model.loading import kv_bytes_per_token, load_model
    from twin import save_twin

    import torch

    embedded = load_model(None, device="cpu")
    facts = embedded.ledger_facts(32)
    tokens = tuple(len(embedded.encode(p)) for p in lesson_prompts(16))
    show("embedded model, the lesson at its vocabulary", facts, RunShape(tokens))
    show("embedded model, the lesson at real scale", facts, RunShape(tokens, vocab_size=RELEASED_VOCAB))
    with tempfile.TemporaryDirectory() as folder:
        twin = load_model(save_twin(folder, canvas_length=256), device="cpu", load_format="dummy")
        prompt = "What is the sky? Explain why it is blue."
        show("structure twin", twin.ledger_facts(32), RunShape((len(twin.encode(prompt)),) * 32, own_sampler=False))
    config = DiffusionGemmaConfig()  # the released widths
    text = config.text_config
    h200 = next(g for g in GPUS if g.key == "h200")
    released = ModelFacts(26 * 10**9 * 2, int(config.canvas_length), int(text.vocab_size), int(text.hidden_size),
                          "bfloat16", kv_bytes_per_token(config, torch.bfloat16), 32, "cuda",
                          getattr(text, "final_logit_softcapping", None))
    show(f"released checkpoint on one {h200.label}", released, RunShape((100,) * 32, own_sampler=False), h200.total_bytes,
         reserve=2 * 2**30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
