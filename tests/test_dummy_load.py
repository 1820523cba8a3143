"""`--load-format dummy`: random weights of a config's shape, built on the device, nothing else read."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import TINY_TEXT, TINY_VISION
from dgemma.model.dummy import build_random_model
from dgemma.model.loading import ModelLoadError, estimate_weight_bytes, load_model
from dgemma.model.release import RELEASE_LAYERS, RELEASE_TEXT, release_config, write_config_dir

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def moe_config_dir(tmp_path_factory) -> str:
    """A config and a tokenizer only: 16 experts top-2 (the runner's many-experts path), no weights."""
    from transformers import DiffusionGemmaConfig

    text = {**TINY_TEXT, "num_experts": 16, "top_k_experts": 2, "vocab_size": 1024, "hidden_size": 64,
            "head_dim": 16, "global_head_dim": 16}
    config = DiffusionGemmaConfig(text_config=text, vision_config=TINY_VISION, canvas_length=8)
    return write_config_dir(tmp_path_factory.mktemp("moe_config"), config)


def test_a_config_directory_holds_no_weights_and_loads_only_with_the_dummy_format(moe_config_dir):
    assert not [p for p in Path(moe_config_dir).iterdir() if p.suffix in (".safetensors", ".bin", ".pt")]
    with pytest.raises(ModelLoadError) as err:
        load_model(moe_config_dir, device="cpu")  # the default reads the checkpoint's weights: there are none
    assert "\n" not in str(err.value)
    loaded = load_model(moe_config_dir, device="cpu", load_format="dummy")
    assert loaded.random_weights and loaded.vocab_size == 1024 and loaded.canvas_length == 8


def test_the_facts_say_random_weights_for_the_header_info_cli_and_recordings(moe_config_dir, tiny_model):
    from dgemma.recording import MODEL_KEYS

    facts = load_model(moe_config_dir, device="cpu", load_format="dummy").facts()
    assert facts["weights"] == "random" and "random weights" in facts["note"]
    assert {"weights", "experts"} <= set(MODEL_KEYS)  # /info's keys and a recording's header's
    assert tiny_model.facts()["weights"] == "checkpoint" and "note" not in tiny_model.facts()


def test_a_dummy_model_is_the_same_every_time_it_is_built(moe_config_dir):
    a = load_model(moe_config_dir, device="cpu", load_format="dummy").model.state_dict()
    b = load_model(moe_config_dir, device="cpu", load_format="dummy").model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_dummy_model_is_built_in_its_dtype_on_its_device_with_tied_weights_once(moe_config_dir):
    loaded = load_model(moe_config_dir, device="cpu", dtype="bfloat16", load_format="dummy")
    model = loaded.model
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert model.lm_head.weight is model.model.decoder.embed_tokens.weight
    unique = {id(p): p for p in model.parameters()}.values()
    assert sum(p.numel() * p.element_size() for p in unique) == loaded.weight_bytes
    decoder = model.model.decoder
    assert float(decoder.embed_tokens.embed_scale) == pytest.approx(64**0.5, rel=1e-2)  # buffers computed, not left empty
    assert torch.isfinite(decoder.rotary_emb.full_attention_inv_freq).all()


def test_the_release_at_full_depth_has_its_widths_and_about_25_billion_parameters():
    model = build_random_model(release_config(), "meta", torch.bfloat16)  # shapes only: nothing allocated
    text = model.config.text_config
    assert text.num_hidden_layers == RELEASE_LAYERS == 30 and text.layer_types.count("full_attention") == 5
    experts = model.model.decoder.layers[0].experts
    assert tuple(experts.gate_up_proj.shape) == (128, 2 * 704, 2816) and tuple(experts.down_proj.shape) == (128, 2816, 704)
    unique = {id(p): p for p in model.parameters()}.values()
    assert 25e9 < sum(p.numel() for p in unique) < 26e9
    assert sum(p.numel() * 2 for p in unique) == estimate_weight_bytes(model.config, torch.bfloat16)
    assert {p.device.type for p in unique} == {"meta"}


def test_the_dummy_load_refuses_a_hub_id_in_one_sentence():
    with pytest.raises(ModelLoadError, match="needs a directory with config.json"):
        load_model("google/diffusiongemma-26B-A4B-it", device="cpu", load_format="dummy")


LAYER = """
import json, resource, sys
from dgemma.model.loading import load_model
from dgemma.model.release import release_config, write_config_dir
path = write_config_dir(sys.argv[1], release_config(layers=1, vocab_size=4096))
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
loaded = load_model(path, device="cpu", load_format="dummy")
grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before
experts = loaded.model.model.decoder.layers[0].experts
print(json.dumps(dict(weight_bytes=loaded.weight_bytes, grown=grown, files=sorted(p.name for p in __import__('pathlib').Path(path).iterdir()),
                      experts=[experts.num_experts, loaded.model.config.text_config.top_k_experts], hidden=loaded.hidden_size)))
"""


@pytest.mark.server  # a fresh interpreter, so that its peak memory is the build's alone
def test_one_release_width_layer_builds_from_its_config_with_the_weights_allocated_once(tmp_path):
    done = subprocess.run([sys.executable, "-c", LAYER, str(tmp_path / "layer")], capture_output=True, text=True,
                          timeout=600, cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr[-2000:]
    row = json.loads(done.stdout.strip().splitlines()[-1])
    assert row["experts"] == [RELEASE_TEXT["num_experts"], RELEASE_TEXT["top_k_experts"]] and row["hidden"] == 2816
    assert not [f for f in row["files"] if f.endswith(".safetensors")]
    # fp32 on a CPU: 3.4 GB of weights; one copy of them, not the two a build-then-tie (or a cast) would make
    assert row["grown"] < 1.25 * row["weight_bytes"]
