"""A structure twin of `google/diffusiongemma-26B-A4B-it`, small enough for a CPU test session.

Random weights and small widths, but the released checkpoint's structural features that the
embedded model lacks: more than 8 experts with top-k 2 (the runner's per-canvas MoE path), sliding
-window layers whose window is shorter than prompt + committed canvases, a wider head on the
full-attention layers (`global_head_dim` -> `per_layer_config`), proportional RoPE with
`partial_rotary_factor` 0.25 on full attention (the config's default `rope_parameters`), vocab
262,144, and a SentencePiece-style tokenizer (metaspace '▁', byte fallback) with a Gemma-style
chat template (`dgemma/model/release.py`'s stand-in). Its directory holds a config and a tokenizer
only, so it loads as a user loads the release's config: `--model DIR --load-format dummy`.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from dgemma.model.release import MINIMAL_VISION, write_config_dir

VOCAB = 262_144
CANVAS = 8
WINDOW = 16  # a chat-templated prompt (~20 tokens) plus one committed canvas already exceed it
TWIN_TEXT = dict(
    vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
    layer_types=["sliding_attention", "sliding_attention", "sliding_attention", "full_attention"],
    sliding_window=WINDOW, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
    global_head_dim=16, num_global_key_value_heads=1, max_position_embeddings=1024,
    num_experts=16, top_k_experts=2, moe_intermediate_size=16,
    pad_token_id=0, eos_token_id=1, bos_token_id=2,
)  # fmt: skip


def save_twin(path: str | Path, canvas_length: int = CANVAS, vocab: int = VOCAB) -> str:
    """The twin's config and tokenizer, saved to `path` with no weights: it loads with
    `--load-format dummy`, random weights built on the device as for the release's own config
    (canvas 8 for the engine's tests; 256, the release's, for the views'). A smaller `vocab`
    records a real-scale run's many steps in seconds: the views draw tokens' text, the same at any
    vocabulary, and the released vocabulary's logits are most of a CPU step."""
    from transformers import DiffusionGemmaConfig

    config = DiffusionGemmaConfig(text_config={**TWIN_TEXT, "vocab_size": vocab}, vision_config=MINIMAL_VISION,
                                  canvas_length=canvas_length)
    return write_config_dir(path, config)


# A run at the release's view scale, recorded once per session for the views' tests (conftest's
# `real_scale_run`): 32 requests x canvas 256, 20 denoising steps that every request takes (a
# confidence threshold no step meets). Its vocabulary is 4,096, not 262,144: the page draws tokens'
# text, a cell of at most 12 characters at any vocabulary, and the released vocabulary's logits made
# a recording cost two minutes of sampler where this one takes about a quarter of one. Twenty steps
# are enough for what the views' tests watch: the first frames, the last ones, and a replay whose
# slow link makes it skip steps.
REAL_REQUESTS, REAL_CANVAS, REAL_STEPS, REAL_VOCAB = 32, 256, 20, 4096


def record_real_scale_run(folder: Path) -> Path:
    """`python -m dgemma.generate --record` of the twin at the view's scale, into `folder`/run.jsonl."""
    model = save_twin(folder / "twin", canvas_length=REAL_CANVAS, vocab=REAL_VOCAB)
    prompts = folder / "prompts.txt"
    prompts.write_text("\n".join(f"What is the sky? Explain why it is blue, number {i}." for i in range(1, REAL_REQUESTS + 1)))
    run = folder / "run.jsonl"
    subprocess.run([sys.executable, "-m", "dgemma.generate", "--prompts-file", str(prompts), "--model", model,
                    "--load-format", "dummy", "--device", "cpu", "--max-num-seqs", str(REAL_REQUESTS),
                    "--max-new-tokens", str(REAL_CANVAS), "--max-denoising-steps", str(REAL_STEPS),
                    "--confidence-threshold", "1e-9", "--sampler", "chunked", "--record", str(run)],
                   cwd=Path(__file__).resolve().parents[1], check=True, capture_output=True, timeout=600)
    return run
