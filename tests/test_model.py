"""Loading checkpoints: local directories through from_pretrained, and one clear line on failure."""

from __future__ import annotations

import pytest
import torch

from dgemma.model.loading import (
    RESERVED_REQUESTS, ModelLoadError, encode_prompt, estimate_weight_bytes, hub_error_sentence, load_model,
    parse_dtype, placement, sampler_reserve_bytes,
)  # fmt: skip


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


def test_dtype_flag_loads_the_weights_in_that_dtype(tiny_model_dir):
    loaded = load_model(tiny_model_dir, device="cpu", dtype="bfloat16")
    assert loaded.dtype == torch.bfloat16
    assert {p.dtype for p in loaded.model.parameters() if p.is_floating_point()} == {torch.bfloat16}


def test_auto_dtype_is_fp32_on_cpu_and_bf16_on_cuda():
    assert parse_dtype("auto", torch.device("cpu")) == torch.float32
    assert parse_dtype(None, torch.device("cuda")) == torch.bfloat16
    assert parse_dtype("float16", torch.device("cpu")) == torch.float16
    with pytest.raises(ModelLoadError, match="unknown dtype 'int8': use auto, bfloat16, float16, float32"):
        parse_dtype("int8", torch.device("cpu"))


def test_cpu_placement_keeps_loading_in_host_memory(tiny_model):
    kwargs, room = placement(torch.device("cpu"), tiny_model.model.config, memory_budget=2**30)
    assert kwargs == {} and room == 2**30


def test_sharded_gpus_keep_room_for_the_calibrated_sampler_transient_of_the_release():
    from transformers import DiffusionGemmaConfig

    release = DiffusionGemmaConfig()  # the released widths: vocab 262,144, canvas 256
    per_request = 256 * 262_144 * 4  # one fp32 [CL, vocab] copy
    copies = sampler_reserve_bytes(release) / (RESERVED_REQUESTS * per_request)
    assert 1.5 < copies < 3  # the reference step holds about 2 fp32 copies per request (docs/benchmarks.md)


def hub_failure(status: int, gated: bool = True) -> OSError:
    """What transformers raises for a refused hub download: an OSError caused by the hub's error."""
    import httpx
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    response = httpx.Response(status, request=httpx.Request("GET", "https://huggingface.co/api/models/google/m"))
    cls = GatedRepoError if gated else RepositoryNotFoundError
    try:
        try:
            raise cls("Access to model google/m is restricted.", response=response)
        except cls as hub_error:
            raise OSError("You are trying to access a gated repo.\nMake sure to have access to it.") from hub_error
    except OSError as err:
        return err


def test_gated_checkpoint_without_a_token_says_to_accept_the_license_and_set_hf_token(monkeypatch):
    monkeypatch.delenv("HF_TOKEN", raising=False)
    sentence = hub_error_sentence("google/m", hub_failure(401))
    assert sentence.startswith("google/m is gated: accept its license at https://huggingface.co/google/m")
    assert "set HF_TOKEN" in sentence and "\n" not in sentence


def test_gated_checkpoint_with_a_token_lacking_access_says_to_accept_the_license(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_test_token_without_access")
    sentence = hub_error_sentence("google/m", hub_failure(403))
    assert "has not been granted access: accept the license at https://huggingface.co/google/m" in sentence


def test_unknown_or_private_hub_id_says_to_check_it_or_set_hf_token():
    assert "is not on the Hugging Face hub: check the id, or set HF_TOKEN" in hub_error_sentence(
        "google/m", hub_failure(404, gated=False)
    )
    assert hub_error_sentence("google/m", OSError("disk full")) is None  # not the hub's refusal


def test_facts_describe_the_model_for_the_page_and_info(tiny_model):
    facts = tiny_model.facts()
    assert facts["parameters"] == sum(p.numel() for p in tiny_model.model.parameters())
    assert (facts["dtype"], facts["device"], facts["vocab_size"], facts["canvas_length"]) == ("float32", "cpu", 64, 16)
    assert facts["chat_template"] is False and facts["embedded"] is False


def test_facts_name_the_model_as_given_never_the_servers_directory(tiny_model, tiny_model_dir, embedded_model):
    from pathlib import Path

    from dgemma.model.source import public_name

    assert tiny_model.facts()["model"] == Path(tiny_model_dir).name  # a local checkpoint: its directory's name
    assert embedded_model.facts()["model"] == "embedded"
    assert public_name("google/diffusiongemma-26B-A4B-it") == "google/diffusiongemma-26B-A4B-it"  # a hub id as given


def test_environment_chooses_the_model_and_limits_when_the_flags_are_absent(monkeypatch, tiny_model_dir):
    import app

    monkeypatch.setenv("DGEMMA_MODEL", tiny_model_dir)
    monkeypatch.setenv("DGEMMA_DEVICE", "cpu")
    monkeypatch.setenv("DGEMMA_MAX_NUM_SEQS", "5")
    monkeypatch.setenv("DGEMMA_MEMORY_BUDGET", "3GiB")
    args = app.parse_args([])
    assert (args.model, args.device, args.max_num_seqs, args.memory_budget) == (tiny_model_dir, "cpu", 5, 3 * 2**30)  # bytes
    flagged = app.parse_args(["--model", "/elsewhere", "--max-num-seqs=7"])
    assert (flagged.model, flagged.max_num_seqs) == ("/elsewhere", 7)  # a flag wins over its variable


def test_a_bad_environment_value_is_one_line_naming_the_variable(monkeypatch, capsys):
    import app

    monkeypatch.setenv("DGEMMA_MAX_NUM_SEQS", "many")
    with pytest.raises(SystemExit) as exit_:
        app.parse_args([])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err == "app.py: error: argument --max-num-seqs: expected a whole number, got 'many' (from $DGEMMA_MAX_NUM_SEQS)"


def test_only_the_embedded_model_is_offered_its_task_prompts(embedded_model, tiny_model):
    from dgemma.examples import PLAIN_PROMPTS, TASK_PROMPTS, example_prompts

    assert embedded_model.facts()["embedded"] is True
    assert example_prompts(embedded_model.facts()) == TASK_PROMPTS
    assert example_prompts(tiny_model.facts()) == PLAIN_PROMPTS  # another checkpoint, no chat template


def test_info_names_the_model_publicly_while_it_loads_too(tiny_model_dir):
    from pathlib import Path

    from dgemma.settings import Limits
    from dgemma.serving.loading import LoadingBackend

    assert LoadingBackend(Limits(), 8, None).info()["model"] == "embedded"  # not assets/model's absolute path
    assert LoadingBackend(Limits(), 8, None, tiny_model_dir).info()["model"] == Path(tiny_model_dir).name
