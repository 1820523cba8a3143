"""The memory budget the lesson proposes for its batch (docs/tiling.md, section 5): what the engine
holds during the run (weights, its default sampler, the lesson sampler's state, the requests' KV
caches) plus 3/4 of one untiled tile's need, so the untiled step runs out of memory and tiles of
about 3/8 of the batch fit."""

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


def suggest_budget(model: LessonModel, requests: int, real_scale: bool) -> str:
    """A budget where one tile of all `requests` cannot fit but smaller tiles can."""
    import torch

    from dgemma.engine.resident import tensor_bytes
    from dgemma.sampling import LMHead, SamplerConfig, TiledSampler, calibrate_tile, reference_tile

    vocab = lesson_vocab(model, real_scale)
    dtype = getattr(torch, model.embed_dtype)

    def state(vocab_size: int) -> int:  # a sampler's per-slot state, the embedding it reads included
        embed = torch.empty(vocab_size, model.hidden_size, dtype=dtype, device="meta")
        return tensor_bytes(TiledSampler(SamplerConfig(model.max_num_seqs, model.canvas_length, vocab_size, embed, model.embed_scale)))

    head = LMHead(torch.empty(model.vocab_size, model.hidden_size, dtype=dtype, device="meta"), model.softcap, vocab)
    embed = torch.empty(vocab, model.hidden_size, dtype=dtype, device="meta")
    calibration = calibrate_tile(reference_tile, model.canvas_length, vocab, embed, head, device=torch.device(model.device))
    tokens = sum(model.prompt_tokens[i % len(model.prompt_tokens)] for i in range(requests))
    held = model.weight_bytes + state(model.vocab_size) + state(vocab) + tokens * model.kv_bytes_per_token
    free = max(int(0.75 * calibration.tile_bytes(requests)), 2 * calibration.tile_bytes(1) + calibration.bytes_per_request)
    return _round_mib(held + free)


def _round_mib(nbytes: int) -> str:
    """Whole MiB when that is close enough (a readable budget); KiB for a tiny model's bytes."""
    mib = -(-nbytes // 2**20)
    if mib >= 64:
        return f"{mib}MiB"
    return f"{-(-nbytes // 1024)}KiB"
