"""Many experts in two modes: per canvas (batch-invariant) and whole batch (one call a layer).

Measured on an Intel Xeon (MKL in its strict mode, `dgemma/reproducible.py`): both modes give a
canvas's hidden states the same bits alone and among seven others; on a CPU without that mode (an
AMD EPYC) per canvas still does and whole batch does not. In MKL's default mode neither
did (docs/benchmarks.md, "Decoder"); on CUDA whole batch is expected to agree to float tolerance only.
"""

from __future__ import annotations

import pytest
import torch

from dgemma.model.dummy import build_random_model
from dgemma.model.loading import ModelLoadError, load_model
from dgemma.model.release import release_config
from dgemma.model.runner import EXPERT_MODES, PER_CANVAS, WHOLE_BATCH, Runner, experts_mode_for, set_experts_mode
from dgemma.reproducible import mkl_strict_mode_holds

CANVAS = 16
HIDDEN = 64
PROMPT_LENGTHS = (5, 17, 9, 30, 3, 12, 21, 8)


@pytest.fixture(scope="module")
def runner() -> Runner:
    """Two layers of the release's kind (sliding + full attention) with 32 experts top-4, small widths."""
    config = release_config(
        layers=2, canvas_length=CANVAS, vocab_size=1024, hidden_size=HIDDEN, intermediate_size=2 * HIDDEN,
        moe_intermediate_size=HIDDEN // 2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        global_head_dim=32, num_global_key_value_heads=1, num_experts=32, top_k_experts=4,
    )  # fmt: skip
    return Runner(build_random_model(config, "cpu", torch.float32))


def decode_alone_and_together(runner: Runner, mode: str) -> tuple[list[torch.Tensor], torch.Tensor]:
    set_experts_mode(runner.model, mode)
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 1024, (n,), generator=gen).tolist() for n in PROMPT_LENGTHS]
    canvases = torch.randint(0, 1024, (len(prompts), CANVAS), generator=gen)
    soft = torch.randn(len(prompts), CANVAS, HIDDEN, generator=gen)
    together = runner.decode(canvases, soft, None, runner.prefill(prompts), hidden_only=True)
    alone = [runner.decode(canvases[i : i + 1], soft[i : i + 1], None, runner.prefill([p]), hidden_only=True)[0]
             for i, p in enumerate(prompts)]
    return alone, together


# Whole batch gives an expert one to three of a batch's tokens, rows whose bits MKL keeps only in
# its strict mode, which exists on Intel CPUs alone (dgemma/reproducible.py checks it is in force).
NEEDS_STRICT_MKL = pytest.mark.skipif(not mkl_strict_mode_holds(), reason="MKL's strict mode is not in force")


@pytest.mark.parametrize("mode", [pytest.param(m, marks=NEEDS_STRICT_MKL) if m == WHOLE_BATCH else m for m in EXPERT_MODES])
def test_a_canvas_gets_the_same_bits_alone_and_among_seven_others_on_a_cpu(runner, mode):
    alone, together = decode_alone_and_together(runner, mode)
    assert all(torch.equal(a, t) for a, t in zip(alone, together))


def test_whole_batch_equals_per_canvas_to_float_tolerance(runner):
    _, per_canvas = decode_alone_and_together(runner, PER_CANVAS)
    _, whole = decode_alone_and_together(runner, WHOLE_BATCH)
    torch.testing.assert_close(whole, per_canvas, rtol=1e-5, atol=1e-5)
    set_experts_mode(runner.model, PER_CANVAS)


def test_auto_is_per_canvas_on_a_cpu_and_whole_batch_on_cuda():
    assert experts_mode_for("auto", torch.device("cpu")) == PER_CANVAS
    assert experts_mode_for("auto", torch.device("cuda")) == WHOLE_BATCH
    assert experts_mode_for(PER_CANVAS, torch.device("cuda")) == PER_CANVAS


def test_the_mode_is_a_load_option_and_a_fact(tiny_model_dir):
    loaded = load_model(tiny_model_dir, device="cpu", experts=WHOLE_BATCH)
    assert loaded.facts()["experts"] == WHOLE_BATCH
    with pytest.raises(ModelLoadError, match="unknown experts mode 'fast'"):
        load_model(tiny_model_dir, device="cpu", experts="fast")
