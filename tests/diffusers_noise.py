"""diffusers' `DiffusionGemmaPipeline` drawing this engine's noise: the comparison the schedulers' claims rest on.

diffusers 0.42.1 draws its randomness with `torch.randint`, `torch.rand` and `torch.multinomial` in
the pipeline (the canvas's random start) and in the schedulers (the re-noising, DDIM's routes, the
corrector's position pick and resample, the entropy bound's sample). Inside `keyed_pipeline` the
pipeline's and the schedulers' modules see a `torch` whose three draws return the engine's keyed
numbers for (seed, canvas, forward, purpose), each row its own, through the engine's own draw
functions (`keyed_tokens`, `keyed_uniform`, `keyed_categorical`); everything else is torch itself,
so the same request gives diffusers and the engine the same noise, and any difference left is one
of the algorithms. The entropy bound's sample is the argmax (a greedy row, as tests/same_noise.py).

The draws come in a fixed order within a forward, which is how a call is told apart: the pipeline's
randint starts a canvas; a scheduler's randint re-noises and ends a predictor forward; DDIM's
3-wide multinomial is its route draw; a `rand` starts a corrector sweep, whose multinomial (the
resample) ends it. A forward's number is the engine's step: the canvas's decoder forwards so far.

The embedded model's tokenizer has no chat template: `PromptProcessor` gives the pipeline the
prompt's ids as the engine encodes them.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
from diffusers.pipelines.diffusion_gemma import pipeline_diffusion_gemma
from diffusers.schedulers import scheduling_block_refinement, scheduling_discrete_ddim, scheduling_entropy_bound

from dgemma.sampling.keyed import INIT, RENOISE, RESAMPLE, ROUTE, SELECT, RowKey, keyed_categorical, keyed_tokens, keyed_uniform, row_keys

MODULES = (pipeline_diffusion_gemma, scheduling_block_refinement, scheduling_discrete_ddim, scheduling_entropy_bound)


class PromptProcessor:
    """The pipeline's processor for a tokenizer without a chat template: a prompt's ids as the engine's."""

    def __init__(self, loaded):
        self.loaded, self.tokenizer = loaded, loaded.tokenizer

    def apply_chat_template(self, messages, **_):
        return {"input_ids": torch.tensor([self.loaded.encode(m["content"]) for m in _conversations(messages)])}

    def batch_decode(self, sequences, **_):
        return [self.tokenizer.decode(s) for s in sequences]


def _conversations(messages):
    return [m[0] for m in messages] if isinstance(messages[0], list) else messages


class _Draws:
    """Where the pipeline is: its rows' seeds, the canvas and the forward the next draw belongs to."""

    def __init__(self, seeds: list[int]):
        self.seeds, self.canvas, self.forward = seeds, -1, 0

    def keys(self, purpose: int, device) -> torch.Tensor:
        return row_keys([RowKey(seed, self.canvas, self.forward) for seed in self.seeds], purpose, device)


class _Torch:
    """torch, but for the draws given."""

    def __init__(self, **draws):
        self.__dict__.update(draws)

    def __getattr__(self, name: str):
        return getattr(torch, name)


def _keyed_torch(draws: _Draws, in_pipeline: bool) -> _Torch:
    """A stand-in for the `torch` module of the pipeline or of a scheduler: torch, but its draws keyed."""

    def randint(low, high, size, *, device=None, generator=None, **_):
        assert low == 0
        if in_pipeline:  # a canvas's random start
            draws.canvas, draws.forward = draws.canvas + 1, 0
            return keyed_tokens(draws.keys(INIT, device), size[1], high)
        tokens = keyed_tokens(draws.keys(RENOISE, device), size[1], high)
        draws.forward += 1  # the re-noise is a predictor forward's last draw
        return tokens

    def rand(*size, device=None, generator=None, **_):
        shape = size[0] if len(size) == 1 else size
        return keyed_uniform(draws.keys(SELECT, device), shape[1])  # a corrector sweep's pick

    def multinomial(probs, num_samples, *, generator=None, **_):
        rows = len(draws.seeds)
        if probs.shape[-1] == 3:  # DDIM's route per position
            uniform = keyed_uniform(draws.keys(ROUTE, probs.device), probs.shape[0] // rows)
            return keyed_categorical(probs, uniform.flatten())[:, None]
        if draws_sweep(probs):
            uniform = keyed_uniform(draws.keys(RESAMPLE, probs.device), probs.shape[0] // rows)
            draws.forward += 1  # the resample is a corrector sweep's last draw
            return keyed_categorical(probs, uniform.flatten())[:, None]
        return probs.argmax(-1, keepdim=True)  # the entropy bound's sample: a greedy row's

    def draws_sweep(probs) -> bool:
        return probs.dtype == torch.float64  # the corrector forms its conditional in float64; samples are fp32

    return _Torch(randint=randint, rand=rand, multinomial=multinomial)


@contextlib.contextmanager
def keyed_noise(seeds: list[int]):
    """Within: diffusers' pipeline and schedulers draw the engine's keyed numbers, row i for seed `seeds[i]`."""
    draws = _Draws(seeds)
    originals = [module.torch for module in MODULES]
    for module in MODULES:
        module.torch = _keyed_torch(draws, module is pipeline_diffusion_gemma)
    try:
        yield draws
    finally:
        for module, original in zip(MODULES, originals):
            module.torch = original


@dataclass
class PipelineRun:
    """What one keyed pipeline call returned: its new tokens (after EOS as diffusers writes them)
    and the predictor steps each canvas took (counted by `callback_on_step_end`)."""

    new_tokens: list[list[int]]
    canvas_steps: list[int]


def keyed_pipeline(pipe, prompts: list[str], seeds: list[int], gen_length: int, **call) -> PipelineRun:
    """`pipe(prompts)` with the engine's noise for `seeds`; the steps of each canvas counted."""
    steps: list[int] = []

    def count(pipeline, step, timestep, kwargs):
        if timestep == 0:
            steps.append(0)
        steps[-1] += 1
        return kwargs

    with keyed_noise(seeds):
        out = pipe(prompt=prompts, gen_length=gen_length, output_type="seq", callback_on_step_end=count, **call)
    return PipelineRun([row.tolist() for row in out.sequences], steps)
