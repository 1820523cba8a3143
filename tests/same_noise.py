"""transformers' `generate` drawing this engine's noise: the comparison the engine's claims rest on.

transformers' DiffusionGemma loop draws its randomness in three places: the canvas's random start
(`EntropyBoundSampler.initialize_canvas`), the re-noising of the positions not accepted
(`renoise_canvas`) and the sample (`torch.multinomial`). Inside `keyed_generate` the first two draw
the engine's keyed tokens for (seed, canvas, step) and the sample is the argmax (a greedy row), so
the same request gives transformers and the engine the same noise: any difference left is one of
the algorithms. The rest of `generate` (the encoder, the decoder, the acceptance, the stopping rule,
the commits, `decoder_input_ids`, `tokens_per_forward`) runs untouched.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
from transformers.models.diffusion_gemma import generation_diffusion_gemma as tg

from dgemma.sampling import SamplingParams
from dgemma.sampling.keyed import INIT, RENOISE, RowKey, keyed_tokens, row_keys


@dataclass
class KeyedRun:
    """What one keyed `generate` call returned: its new tokens (pad after EOS, as transformers
    writes them), its `tokens_per_forward`, and the decoder passes each canvas took."""

    new_tokens: list[int]
    tokens_per_forward: float
    canvas_steps: list[int]


@contextlib.contextmanager
def _engine_noise(seed: int, vocab_size: int, max_steps: int, steps_log: list[int]):
    canvas = {"index": -1}
    original = (tg.EntropyBoundSampler.initialize_canvas, tg.EntropyBoundSampler.renoise_canvas, torch.multinomial)

    def initialize_canvas(self, batch_size: int, device: torch.device) -> torch.Tensor:
        # generate() evaluates this once per canvas (even when decoder_input_ids replaces it).
        canvas["index"] += 1
        steps_log.append(0)
        keys = row_keys([RowKey(seed, canvas["index"], 0)], INIT, device)
        return keyed_tokens(keys, self.canvas_length, vocab_size).expand(batch_size, -1).clone()

    def renoise_canvas(self, accepted: torch.Tensor, cur_step) -> torch.Tensor:
        step = max_steps - int(cur_step)  # transformers counts the steps left; the engine the steps done
        steps_log[-1] = step + 1
        keys = row_keys([RowKey(seed, canvas["index"], step)], RENOISE, accepted.device)
        noise = keyed_tokens(keys, self.canvas_length, vocab_size).expand_as(accepted)
        return torch.where(self.accepted_token_mask, accepted, noise)

    def argmax_sample(probs: torch.Tensor, num_samples: int, *args, **kwargs) -> torch.Tensor:
        return probs.argmax(-1, keepdim=True)

    tg.EntropyBoundSampler.initialize_canvas = initialize_canvas
    tg.EntropyBoundSampler.renoise_canvas = renoise_canvas
    torch.multinomial = argmax_sample
    try:
        yield
    finally:
        tg.EntropyBoundSampler.initialize_canvas, tg.EntropyBoundSampler.renoise_canvas, torch.multinomial = original


def keyed_generate(model, prompt_ids: list[int], params: SamplingParams, max_new_tokens: int,
                   decoder_input_ids: list[int] | None = None) -> KeyedRun:
    """transformers' generate on one prompt with the engine's noise for `params.seed` (greedy rows)."""
    config = model.generation_config
    overrides = dict(
        max_denoising_steps=params.max_denoising_steps, t_min=params.t_min, t_max=params.t_max,
        confidence_threshold=params.confidence_threshold, stability_threshold=params.stability_threshold,
        sampler_config=tg.EntropyBoundSamplerConfig(entropy_bound=params.entropy_bound),
        max_new_tokens=max_new_tokens, return_dict_in_generate=True,
    )  # fmt: skip
    extra = {} if decoder_input_ids is None else {"decoder_input_ids": torch.tensor([decoder_input_ids])}
    steps: list[int] = []
    with _engine_noise(params.seed, model.config.text_config.vocab_size, params.max_denoising_steps, steps), torch.no_grad():
        out = model.generate(torch.tensor([prompt_ids]), **overrides, **extra)
    new = out.sequences[0, len(prompt_ids):].tolist()
    return KeyedRun(new, float(out.tokens_per_forward[0]), steps)
