"""The sampler's tile step compiled on a dedicated GPU, eager elsewhere (engine/samplers.py).

Compiling the step on this CPU did not finish within 400 s for the tiny model (two shared cores),
so the compiled path's tokens are measured by scripts/gpu_session.sh on a GPU; here, its rules."""

from __future__ import annotations

import pytest
import torch

from dgemma.engine.samplers import COMPILE_ENV, compiled_tile, compiles_sampler
from dgemma.sampling.reference import reference_tile


def test_auto_compiles_on_a_dedicated_gpu_only(monkeypatch):
    monkeypatch.delenv(COMPILE_ENV, raising=False)
    monkeypatch.delenv("SPACES_ZERO_GPU", raising=False)
    assert compiles_sampler(torch.device("cuda")) and not compiles_sampler(torch.device("cpu"))
    monkeypatch.setenv("SPACES_ZERO_GPU", "1")  # ZeroGPU's forked worker may not compile
    assert not compiles_sampler(torch.device("cuda"))


def test_the_variable_overrides_auto_and_a_bad_value_is_one_sentence(monkeypatch):
    monkeypatch.setenv(COMPILE_ENV, "on")
    assert compiles_sampler(torch.device("cpu"))
    monkeypatch.setenv(COMPILE_ENV, "off")
    assert not compiles_sampler(torch.device("cuda"))
    monkeypatch.setenv(COMPILE_ENV, "maybe")
    with pytest.raises(ValueError, match="must be on, off or auto"):
        compiles_sampler(torch.device("cpu"))


def test_the_calibration_on_meta_tensors_runs_the_eager_step(tiny_model):
    """A compiled sampler still calibrates: meta inputs take the eager function, compiling nothing."""
    from dgemma.sampling import SamplerConfig, build_sampler

    sampler = build_sampler(SamplerConfig(4, tiny_model.canvas_length, tiny_model.vocab_size, tiny_model.embed_weight,
                                          tiny_model.embed_scale))
    eager = sampler.calibration()
    sampler.tile_fn = compiled_tile(reference_tile)
    sampler._calibration = None
    assert sampler.calibration() == eager and sampler.tile_fn.eager is reference_tile
