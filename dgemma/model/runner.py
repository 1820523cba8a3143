"""Batched encoder/decoder calls over per-request KV caches.

Every request owns a batch-1 `DynamicCache`, filled by the causal encoder: first its prompt
(prefill), then every canvas it commits. Requests therefore have caches of different lengths.

The decoder runs all denoising canvases as ONE batch. Projections, norms, routing and rotary
(with per-row positions) are row-wise, so batching them is exact. Two things are not:
- attention, where each row must see its own cache. Padding the caches to one length and
  masking would change the floating-point reduction order with the batch's longest member, so
  attention runs per cache length (rows of equal length together) on exactly the tensors a solo
  run builds: cat(own cache, own canvas);
- the MoE experts, which gather the tokens routed to each expert from the whole batch into one
  matmul whose shape (and so rounding) depends on the batch-mates. With few experts (<= 8, the
  embedded model has 2) every expert runs densely over all tokens and the router's weights pick
  the results — plain row-wise matmuls, so exact, and cheaper on a CPU than 2 grouped matmuls per
  canvas. With many experts there are two modes (`EXPERT_MODES`): per canvas, the model's own
  experts called once per canvas, so a canvas's products never see its batch-mates (but every
  expert's weights are read once per canvas); or whole batch, one call over every canvas's
  tokens, reading the weights once a step, its rounding free to depend on the batch.
So a request's logits do not depend on who shares its batch (per canvas) — on CPU they are bit-identical
to its solo run, which is what makes a seeded request give the same tokens alone or among 32.
(On CUDA, cuBLAS picks kernels by matrix shape, so expect agreement to float tolerance only.)

The decoder is fed the sampler's stored soft embeddings `[CL, hidden]` (docs/design.md, step 7: carry-over)
instead of `[CL, vocab]` logits: `decode` re-states `DiffusionGemmaDecoderModel.forward` from the
point where transformers turns logits into soft embeddings.
"""

from __future__ import annotations

import copy

import torch
from transformers import DynamicCache
from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS, ExpertsInterface
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS, AttentionInterface

RAGGED = "dgemma_ragged"
ROWWISE = "dgemma_rowwise"


def ragged_attention(module, query, key, value, attention_mask, *, dgemma_caches=None, **kwargs):
    """Attention where row b attends to cat(its own cache, its canvas); plain attention otherwise.

    Registered as an attention implementation for the decoder's attention modules only. Without
    `dgemma_caches` (e.g. inside transformers' own `generate`) it is the model's original attention.
    Rows whose caches have the same length share one call (batch rows of an attention call are
    computed independently); no row is ever padded.
    """
    if dgemma_caches is None:
        base = ALL_ATTENTION_FUNCTIONS.get_interface(module._dgemma_base_impl, _eager)
        return base(module, query, key, value, attention_mask, **kwargs)
    layers = [cache.layers[module.layer_idx] for cache in dgemma_caches]
    groups: dict[int, list[int]] = {}
    for b, layer in enumerate(layers):
        groups.setdefault(layer.keys.shape[-2], []).append(b)
    gqa = query.shape[1] != key.shape[1]
    out = query.new_empty(query.shape[0], query.shape[2], query.shape[1], query.shape[3])  # [n, CL, heads, dim]
    for rows in groups.values():
        if len(rows) == 1:
            b = rows[0]
            q, k_cache, v_cache = query[b : b + 1], layers[b].keys, layers[b].values
            k_new, v_new = key[b : b + 1], value[b : b + 1]
        else:
            index = torch.tensor(rows, device=query.device)
            q, k_new, v_new = query[index], key[index], value[index]
            k_cache = torch.cat([layers[b].keys for b in rows])
            v_cache = torch.cat([layers[b].values for b in rows])
        k = torch.cat([k_cache, k_new], dim=-2)  # what append_to_cache builds for a solo run
        v = torch.cat([v_cache, v_new], dim=-2)
        # bidirectional: no mask, not causal
        attn = torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=module.scaling, enable_gqa=gqa)
        out[rows] = attn.transpose(1, 2)
    return out, None


def _eager(*args, **kwargs):
    from transformers.models.diffusion_gemma.modeling_diffusion_gemma import eager_attention_forward

    return eager_attention_forward(*args, **kwargs)


DENSE_MAX_EXPERTS = 8  # dense costs num_experts / top_k times the routed FLOPs: fine for a few


def dense_experts(module, hidden_states, top_k_index, top_k_weights):
    """Every expert over every token, weighted by the router (zero where not routed): row-wise."""
    out = torch.zeros_like(hidden_states)
    for e in range(module.num_experts):
        weight = (top_k_weights * (top_k_index == e)).sum(dim=-1, keepdim=True)  # [tokens, 1]
        gate_up = torch.nn.functional.linear(hidden_states, module.gate_up_proj[e])
        gate, up = gate_up.chunk(2, dim=-1)
        expert_out = torch.nn.functional.linear(module.act_fn(gate) * up, module.down_proj[e])
        out += expert_out * weight.to(expert_out.dtype)
    return out


PER_CANVAS = "per_canvas"
WHOLE_BATCH = "whole_batch"
EXPERT_MODES = (PER_CANVAS, WHOLE_BATCH)
"""How the decoder runs more than DENSE_MAX_EXPERTS experts: once per canvas (batch-invariant, the
weights read once per canvas) or once over the whole batch (the weights read once a step)."""


def experts_mode_for(mode: str, device: torch.device) -> str:
    """`--experts`: auto is per canvas on a CPU (invariant, and MKL's products are not bandwidth-bound
    there) and whole batch on CUDA (a step at 32 canvases would read every expert 32 times: about
    0.3 s at the release's size on an H200, against 9.5 ms once; docs/benchmarks.md, "Decoder")."""
    if mode == "auto":
        return WHOLE_BATCH if torch.device(device).type == "cuda" else PER_CANVAS
    if mode not in EXPERT_MODES:
        raise ValueError(f"unknown experts mode {mode!r}: use auto, {' or '.join(EXPERT_MODES)}")
    return mode


def set_experts_mode(model, mode: str) -> None:
    """Choose per canvas or whole batch for every MoE layer of `model` (read at each call)."""
    if mode not in EXPERT_MODES:
        raise ValueError(f"unknown experts mode {mode!r}: use {' or '.join(EXPERT_MODES)}")
    model._dgemma_experts = mode
    for layer in [*model.model.decoder.layers, *model.model.encoder.language_model.layers]:
        layer.experts._dgemma_experts = mode


def rowwise_experts(module, hidden_states, top_k_index, top_k_weights):
    """Dense for a few experts (exact); else the model's own, per canvas or over the whole batch."""
    if module.num_experts <= DENSE_MAX_EXPERTS:
        return dense_experts(module, hidden_states, top_k_index, top_k_weights)
    base = ALL_EXPERTS_FUNCTIONS.get_interface(module._dgemma_base_impl, type(module).forward.__wrapped__)
    rows, n = module._dgemma_rows, hidden_states.shape[0]
    if n <= rows or getattr(module, "_dgemma_experts", PER_CANVAS) == WHOLE_BATCH:
        return base(module, hidden_states, top_k_index, top_k_weights)
    return torch.cat([base(module, hidden_states[i : i + rows], top_k_index[i : i + rows], top_k_weights[i : i + rows])
                      for i in range(0, n, rows)], dim=0)


def install_batch_invariance(model) -> None:
    """Point the decoder's attention and every MoE block at the batch-invariant versions. Idempotent.

    Each module gets a private copy of the config (encoder and decoder share the original), and
    both replacements fall back to the original without our arguments, so transformers' own
    `generate` still runs on the patched model (the benchmark's baseline uses an untouched copy).
    """
    AttentionInterface.register(RAGGED, ragged_attention)
    ExpertsInterface.register(ROWWISE, rowwise_experts)
    canvas_length = int(model.config.canvas_length)
    for layer in model.model.decoder.layers:
        attn = layer.self_attn
        if getattr(attn, "_dgemma_base_impl", None) is None:
            attn._dgemma_base_impl = attn.config._attn_implementation or "eager"
            attn.config = copy.copy(attn.config)
            attn.config._attn_implementation_internal = RAGGED
    for layer in [*model.model.decoder.layers, *model.model.encoder.language_model.layers]:
        experts = layer.experts
        if getattr(experts, "_dgemma_base_impl", None) is None:
            experts._dgemma_base_impl = experts.config._experts_implementation or "eager"
            experts._dgemma_rows = canvas_length
            experts.config = copy.copy(experts.config)
            experts.config._experts_implementation_internal = ROWWISE


PREFILL_BLOCK = 16  # prompts are right-padded to a multiple of this (see Runner.prefill)


class Runner:
    """Owns the model calls; the engine owns the scheduling. Not thread-safe: one engine thread."""

    def __init__(self, model) -> None:
        self.model = model
        self.decoder = model.model.decoder
        self.encoder = model.model.encoder
        self.text_config = model.config.text_config
        self.canvas_length = int(model.config.canvas_length)
        self.device = self.decoder.embed_tokens.weight.device
        install_batch_invariance(model)

    # -- encoder -------------------------------------------------------------------------------

    def new_cache(self) -> DynamicCache:
        return DynamicCache(config=self.text_config)

    @torch.no_grad()
    def prefill(self, prompts: list[list[int]], pad_id: int = 0) -> list[DynamicCache]:
        """Fresh caches holding each prompt, encoding prompts of similar length together.

        Every prompt is right-padded to a multiple of PREFILL_BLOCK and the padding cropped from
        its cache afterwards: the encoder is causal, so real tokens never see the padding, and
        each prompt's rows enter the matmuls as whole aligned blocks whatever the batch, so its
        cache does not depend on its batch-mates (a solo prefill takes this same path).
        Sliding layers: the batch cache keeps every position (the window is in the mask), and
        each request's own cache trims itself on `update`. With many experts (rowwise MoE),
        prompts are encoded one by one instead (still the same path alone or in a batch).
        """
        caches: list[DynamicCache | None] = [None] * len(prompts)
        groups: dict[int, list[int]] = {}
        for i, ids in enumerate(prompts):
            padded = -(-len(ids) // PREFILL_BLOCK) * PREFILL_BLOCK
            if self._pads_exactly(padded):
                groups.setdefault(padded, []).append(i)
            else:
                caches[i] = self.new_cache()
                self.append_to_cache(caches[i], torch.tensor(ids))
        for padded, rows in groups.items():
            ids = torch.full((len(rows), padded), pad_id, dtype=torch.long)
            for j, i in enumerate(rows):
                ids[j, : len(prompts[i])] = torch.tensor(prompts[i])
            batch = DynamicCache()  # full-length layers: sliding masks come from the config
            positions = torch.arange(padded, device=self.device).unsqueeze(0)
            self.encoder(input_ids=ids.to(self.device), past_key_values=batch, position_ids=positions, use_cache=True)
            for j, i in enumerate(rows):
                cache = caches[i] = self.new_cache()
                length = len(prompts[i])
                for mine, full in zip(cache.layers, batch.layers):
                    mine.update(full.keys[j : j + 1, :, :length].clone(), full.values[j : j + 1, :, :length].clone())
        return caches

    def _pads_exactly(self, padded: int) -> bool:
        # Dense experts are row-wise at any token count; per canvas ones assume canvas-sized rows;
        # whole batch ones have given up invariance, so prompts may share their calls too.
        experts = self.encoder.language_model.layers[0].experts
        return experts.num_experts <= DENSE_MAX_EXPERTS or getattr(experts, "_dgemma_experts", PER_CANVAS) == WHOLE_BATCH

    @torch.no_grad()
    def append_to_cache(self, cache: DynamicCache, token_ids: torch.Tensor) -> None:
        """Append `token_ids` [L] to one request's cache (a commit of a canvas, or a prompt)."""
        start = cache.get_seq_length()
        ids = token_ids.to(self.device, torch.long).reshape(1, -1)
        positions = torch.arange(start, start + ids.shape[1], device=self.device).unsqueeze(0)
        self.encoder(input_ids=ids, past_key_values=cache, position_ids=positions, use_cache=True)

    # -- decoder -------------------------------------------------------------------------------

    @torch.no_grad()
    def decode(self, canvases: torch.Tensor, soft_embeds: torch.Tensor | None, has_soft: torch.Tensor | None,
               caches: list[DynamicCache], hidden_only: bool = False) -> torch.Tensor:
        """Logits [n, CL, vocab] (fp32, soft-capped) for n canvases [n, CL], each over its own cache.

        soft_embeds [n, CL, hidden]: the previous step's probs @ embed_weight * embed_scale;
        rows with has_soft False (first step of a canvas) get zeros, as transformers does.
        hidden_only: return the final hidden states [n, CL, hidden] instead, for a sampler that
        applies the LM head per tile (then no [n, CL, vocab] tensor exists outside a tile).
        """
        dec = self.decoder
        canvases = canvases.to(self.device)
        n, cl = canvases.shape
        # Per-row positions: the canvas continues after everything its request has encoded.
        starts = torch.tensor([c.get_seq_length() for c in caches], device=self.device)
        positions = starts[:, None] + torch.arange(cl, device=self.device)[None, :]

        hidden = dec.embed_tokens(canvases)
        if soft_embeds is None:
            soft = torch.zeros_like(hidden)
        else:
            soft = soft_embeds.to(hidden.dtype)
            if has_soft is not None:
                soft = soft * has_soft.to(self.device, hidden.dtype)[:, None, None]
        hidden = dec.self_conditioning(hidden, soft)

        rotary = {t: dec.rotary_emb(hidden, positions, t) for t in dec.unique_layer_types}
        layer_types = self.text_config.layer_types
        for i, layer in enumerate(dec.layers[: self.text_config.num_hidden_layers]):
            # past_key_values None: the ragged attention reads each row's own cache instead
            hidden = layer(hidden, position_embeddings=rotary[layer_types[i]], attention_mask=None, position_ids=positions,
                           past_key_values=None, dgemma_caches=caches)
        hidden = dec.norm(hidden)
        return hidden if hidden_only else self.lm_logits(hidden)

    def lm_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.model.lm_head(hidden).to(torch.float32)
        cap = self.model.final_logit_softcapping
        if cap is not None:
            logits = torch.tanh(logits / cap) * cap
        return logits

    def soft_from_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """transformers' self-conditioning input from logits — what the sampler stores per slot."""
        weight = self.decoder.embed_tokens.weight
        probs = logits.softmax(dim=-1, dtype=torch.float32).to(weight.dtype)
        return (probs @ weight) * self.decoder.embed_tokens.embed_scale.to(weight.dtype)
