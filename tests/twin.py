"""A structure twin of `google/diffusiongemma-26B-A4B-it`, small enough for a CPU test session.

Random weights and small widths, but the released checkpoint's structural features that the
embedded model lacks: more than 8 experts with top-k 2 (the runner's per-canvas MoE path), sliding
-window layers whose window is shorter than prompt + committed canvases, a wider head on the
full-attention layers (`global_head_dim` -> `per_layer_config`), proportional RoPE with
`partial_rotary_factor` 0.25 on full attention (the config's default `rope_parameters`), vocab
262,144, and a SentencePiece-style tokenizer (metaspace '▁', byte fallback) with a Gemma-style
chat template. Written with `save_pretrained`, so it loads through the real `--model DIR` path.
"""

from __future__ import annotations

from pathlib import Path

import torch

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
TWIN_VISION = dict(
    model_type="gemma4_vision", hidden_size=16, intermediate_size=32, num_hidden_layers=1,
    num_attention_heads=2, num_key_value_heads=2, head_dim=8,
)  # fmt: skip

SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "<start_of_turn>", "<end_of_turn>"]
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<start_of_turn>{{ 'model' if m['role'] == 'assistant' else m['role'] }}\n"
    "{{ m['content'] | trim }}<end_of_turn>\n{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)
WORDS = "what is the a of to and in how why does do you can explain write short poem about sky blue rain".split()


def build_twin_tokenizer(vocab: int = VOCAB):
    """A Unigram (SentencePiece-style) tokenizer with `vocab` (262,144) pieces: specials, bytes,
    characters, a few words, then filler pieces that look like the long word pieces of a real vocabulary."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    pieces = list(SPECIALS) + [f"<0x{b:02X}>" for b in range(256)]
    chars = [chr(c) for c in range(33, 127)]
    pieces += chars + ["▁" + c for c in chars] + ["▁", "\n"] + ["▁" + w for w in WORDS]
    pieces += [f"▁filler{i}" for i in range(vocab - len(pieces))]
    scores = [(p, 0.0 if i < len(SPECIALS) else -1.0 - (len(p) == 1)) for i, p in enumerate(pieces)]
    core = Tokenizer(models.Unigram(scores, unk_id=3, byte_fallback=True))
    core.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
    core.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    return PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token="<pad>", eos_token="<eos>", bos_token="<bos>", unk_token="<unk>",
        mask_token="<mask>", additional_special_tokens=["<start_of_turn>", "<end_of_turn>"],
        chat_template=CHAT_TEMPLATE,
    )


def save_twin(path: str | Path, seed: int = 0, canvas_length: int = CANVAS, vocab: int = VOCAB) -> str:
    """The twin, saved to `path` (canvas 8 for the engine's tests; 256, the release's, for the views').
    A smaller `vocab` records a real-scale run's many steps in seconds: the views draw tokens' text,
    the same at any vocabulary, and the released vocabulary's logits are most of a CPU step."""
    from transformers import DiffusionGemmaConfig, DiffusionGemmaForBlockDiffusion

    torch.manual_seed(seed)
    config = DiffusionGemmaConfig(text_config={**TWIN_TEXT, "vocab_size": vocab}, vision_config=TWIN_VISION,
                                  canvas_length=canvas_length)
    model = DiffusionGemmaForBlockDiffusion(config)
    # Peaked logits, as a trained model has: with the default init (std 0.02) every position's
    # distribution over 262,144 tokens is flat to 1e-6, and which positions the entropy bound
    # accepts would hinge on rounding. Std 1 on the (tied) embedding spreads the logits over ~±15.
    with torch.no_grad():
        model.model.decoder.embed_tokens.weight.normal_(0.0, 1.0)
    model.save_pretrained(str(path))
    build_twin_tokenizer(vocab).save_pretrained(str(path))
    return str(path)
