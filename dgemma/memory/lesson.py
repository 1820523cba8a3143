"""What the lesson's memory budget reads of a model, as plain values (`LessonModel`), and the
vocabulary its sampler runs at; the budget itself is the lesson's serving policy
(dgemma/serving/backend.py's `suggest_budget`, docs/tiling.md section 5)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from dgemma.gpus import RELEASED_VOCAB


@dataclass(frozen=True)
class LessonModel:
    """What the budget reads of a model, as plain values (ZeroGPU's main process has no weights)."""

    device: str  # where the engine runs its sampler step: a CPU's step takes positions in groups
    weight_bytes: int
    canvas_length: int
    vocab_size: int
    hidden_size: int
    embed_dtype: str
    embed_scale: float
    softcap: float | None
    max_num_seqs: int  # the engine's samplers hold state for this many slots
    prompt_tokens: tuple[int, ...]  # each of the lesson's prompts (cycled over the batch), tokenized as the engine does
    kv_bytes_per_token: int


def lesson_model(loaded, max_num_seqs: int, prompts: Sequence[str], device: str | None = None) -> LessonModel:
    """`loaded`'s figures for the lesson's budget over `prompts` (examples.LESSON_PROMPTS; `device`: where the
    engine runs, if not where it loaded)."""
    return LessonModel(
        device or str(loaded.device), loaded.weight_bytes, loaded.canvas_length, loaded.vocab_size, loaded.hidden_size,
        str(loaded.embed_weight.dtype).removeprefix("torch."), loaded.embed_scale,
        getattr(loaded.model, "final_logit_softcapping", None), max_num_seqs,
        tuple(len(loaded.encode(p)) for p in prompts), kv_bytes_per_token(loaded.model.config, loaded.embed_weight.dtype),
    )  # fmt: skip


def kv_bytes_per_token(config, dtype) -> int:
    """A token's keys and values over every decoder layer (full-attention layers may have heads of their own)."""
    text = getattr(config, "text_config", config)
    spec = vars(text).get("_heterogeneity_spec")
    if spec is not None and spec.per_layer_attributes:  # transformers' per-layer config: each layer's own heads
        return sum(2 * layer.num_key_value_heads * layer.head_dim for layer in text.per_layer_config) * dtype.itemsize
    head = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    kinds = getattr(text, "layer_types", None) or ["sliding_attention"] * text.num_hidden_layers
    total = 0
    for kind in kinds:
        dim, heads = head, text.num_key_value_heads
        if kind == "full_attention":
            dim = getattr(text, "global_head_dim", None) or dim
            heads = getattr(text, "num_global_key_value_heads", None) or heads
        total += 2 * heads * dim
    return total * dtype.itemsize


def lesson_vocab(model: LessonModel, real_scale: bool) -> int:
    """The vocabulary the lesson's sampler runs at: the released model's at real scale."""
    return max(RELEASED_VOCAB, model.vocab_size) if real_scale else model.vocab_size
