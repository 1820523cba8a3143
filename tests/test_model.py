"""Loading checkpoints: local directories through from_pretrained, and one clear line on failure."""

from __future__ import annotations

import pytest
import torch

from dgemma.model.loading import ModelLoadError, encode_prompt, estimate_weight_bytes, load_model


def test_local_checkpoint_loads_in_fp32_on_cpu_with_its_facts(tiny_model):
    assert tiny_model.dtype == torch.float32
    assert tiny_model.device.type == "cpu"
    assert (tiny_model.canvas_length, tiny_model.vocab_size, tiny_model.hidden_size) == (16, 64, 128)
    assert tiny_model.eos_token_ids == (1,)
    assert not tiny_model.model.training


def test_weight_estimate_from_config_matches_the_loaded_weights(tiny_model):
    loaded = {id(p): p.numel() * p.element_size() for p in tiny_model.model.parameters()}
    assert estimate_weight_bytes(tiny_model.model.config, torch.float32) == sum(loaded.values())


def test_prompt_encoding_uses_the_tokenizer_and_round_trips(tiny_model):
    ids = encode_prompt(tiny_model.tokenizer, "add 12+34")
    assert ids[0] == 2  # <bos>: the project tokenizer has no chat template, so it adds its own
    assert tiny_model.tokenizer.decode(ids, skip_special_tokens=True) == "add 12+34"


def test_unknown_model_path_fails_with_one_line(tmp_path):
    with pytest.raises(ModelLoadError, match="model path not found") as err:
        load_model(str(tmp_path / "nope" / "nothing"))
    assert "\n" not in str(err.value)


def test_directory_without_config_is_not_a_checkpoint(tmp_path):
    with pytest.raises(ModelLoadError, match="no config.json"):
        load_model(str(tmp_path))


def test_hub_id_without_network_fails_with_one_line(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # never download in tests
    with pytest.raises(ModelLoadError, match="not in the local Hugging Face cache") as err:
        load_model("google/diffusiongemma-26B-A4B-it")
    assert "\n" not in str(err.value)


def test_checkpoint_larger_than_the_budget_is_refused_before_loading(tiny_model_dir):
    with pytest.raises(ModelLoadError, match=r"needs [\d.]+ [KMG]?i?B for its weights but only 1 KiB"):
        load_model(tiny_model_dir, device="cpu", memory_budget=1024)


def test_prompt_goes_through_the_chat_template_when_the_tokenizer_has_one(tiny_model):
    import copy

    tokenizer = copy.deepcopy(tiny_model.tokenizer)
    tokenizer.chat_template = "{{ bos_token }}{% for m in messages %}user: {{ m['content'] }}.{% endfor %}"
    ids = encode_prompt(tokenizer, "add 1+2")
    assert tokenizer.decode(ids, skip_special_tokens=True) == "user: add 1+2."
