"""The sampler's tile step compiled on a dedicated GPU, eager elsewhere (engine/samplers.py chooses,
sampling/steps.py compiles, as the sampler's config says).

Compiling the step on this CPU did not finish within 400 s for the tiny model (two shared cores),
so the compiled path's tokens are measured by scripts/gpu_session.sh on a GPU; here, its rules."""

from __future__ import annotations

import pytest
import torch

from dgemma.engine.samplers import COMPILE_ENV, compiles_sampler
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


def test_a_compiled_sampler_is_built_whole_and_calibrates_on_the_eager_step(tiny_model):
    """A sampler comes out of its one config complete, its step compiled or not; a compiled one still
    calibrates: meta inputs take the eager function, compiling nothing."""
    from dgemma.sampling import SamplerConfig, TiledSampler

    def built(compiled: bool) -> TiledSampler:
        return TiledSampler(SamplerConfig(4, tiny_model.canvas_length, tiny_model.vocab_size, tiny_model.embed_weight,
                                          tiny_model.embed_scale, compiled=compiled))

    eager, compiled = built(False), built(True)
    assert eager.tile_fn is reference_tile and compiled.tile_fn.eager is reference_tile
    assert compiled.calibration() == eager.calibration()


def test_the_engines_pool_builds_its_sampler_compiled_where_the_rule_says(tiny_model, monkeypatch):
    from dgemma.engine import Engine, EngineConfig

    for choice, compiled in (("on", True), ("off", False)):
        monkeypatch.setenv(COMPILE_ENV, choice)
        pool = Engine(tiny_model, EngineConfig(max_num_seqs=2)).core.samplers  # not started: built, never stepped
        sampler = pool.get(pool.default)
        assert sampler.config.compiled is compiled and getattr(sampler.tile_fn, "eager", sampler.tile_fn) is reference_tile
