"""The released checkpoint's shape, as this project knows it, and a config directory of it.

`google/diffusiongemma-26B-A4B-it` cannot be downloaded here, so its config is written down:
depth and widths from public copies of its `config.json` (docs/model.md, "The release's shape").
With `--load-format dummy` a directory holding only a config and a tokenizer is a model: random
weights of that shape, built on the device (`dgemma/model/dummy.py`).

    python -m dgemma.model.release DIR [--layers N] [--vocab V] [--canvas-length CL]

writes such a directory: the release's config (optionally shallower, or with a smaller vocabulary
for a CPU) and a stand-in tokenizer of as many pieces with a Gemma-style chat template (the
release's own tokenizer is not here either; a random-weight model's text is noise anyway).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

RELEASE_LAYERS = 30
"""Five groups of five sliding-window layers and one full-attention layer."""

RELEASE_TEXT = dict(
    vocab_size=262_144, hidden_size=2816, intermediate_size=2112, num_attention_heads=16,
    num_key_value_heads=8, head_dim=256, global_head_dim=512, num_global_key_value_heads=2,
    num_experts=128, top_k_experts=8, moe_intermediate_size=704, sliding_window=1024,
    max_position_embeddings=131_072, final_logit_softcapping=30.0,
    pad_token_id=0, eos_token_id=1, bos_token_id=2,
)  # fmt: skip
RELEASE_CANVAS = 256
# The vision tower is never run by this app (text in, text out); a minimal one keeps the config valid
# without the release's ~0.4 B vision parameters.
MINIMAL_VISION = dict(
    model_type="gemma4_vision", hidden_size=16, intermediate_size=32, num_hidden_layers=1,
    num_attention_heads=2, num_key_value_heads=2, head_dim=8,
)  # fmt: skip


def layer_types(layers: int) -> list[str]:
    """The release's pattern, every sixth layer full attention, and the last one always full."""
    types = ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(layers)]
    types[-1] = "full_attention"
    return types


def release_config(layers: int = RELEASE_LAYERS, canvas_length: int = RELEASE_CANVAS, **text_overrides):
    """A DiffusionGemmaConfig of the release's widths, `layers` deep (the release: 30)."""
    from transformers import DiffusionGemmaConfig

    text = {**RELEASE_TEXT, "num_hidden_layers": layers, "layer_types": layer_types(layers), **text_overrides}
    return DiffusionGemmaConfig(text_config=text, vision_config=MINIMAL_VISION, canvas_length=canvas_length)


SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "<start_of_turn>", "<end_of_turn>"]
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<start_of_turn>{{ 'model' if m['role'] == 'assistant' else m['role'] }}\n"
    "{{ m['content'] | trim }}<end_of_turn>\n{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)
WORDS = "what is the a of to and in how why does do you can explain write short poem about sky blue rain".split()


def stand_in_tokenizer(vocab: int = RELEASE_TEXT["vocab_size"]):
    """A Unigram (SentencePiece-style) tokenizer with `vocab` pieces: specials, bytes, characters,
    a few words, then filler pieces that look like the long word pieces of a real vocabulary."""
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


def write_config_dir(path: str | Path, config) -> str:
    """`config.json` and a stand-in tokenizer of the config's vocabulary in `path`: no weights."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(str(path))
    stand_in_tokenizer(int(config.text_config.vocab_size)).save_pretrained(str(path))
    return str(path)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m dgemma.model.release", description=__doc__.split("\n\n")[0])
    p.add_argument("dir", help="the directory to write (config.json and a tokenizer)")
    p.add_argument("--layers", type=int, default=RELEASE_LAYERS, help=f"depth (default {RELEASE_LAYERS}, the release's)")
    p.add_argument("--vocab", type=int, default=RELEASE_TEXT["vocab_size"], help="vocabulary (default the release's)")
    p.add_argument("--canvas-length", type=int, default=RELEASE_CANVAS, help="canvas (default 256)")
    args = p.parse_args(argv)
    if args.layers < 1 or args.vocab < 1024:
        p.error("--layers must be >= 1 and --vocab >= 1024")
    print(write_config_dir(args.dir, release_config(args.layers, args.canvas_length, vocab_size=args.vocab)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
