"""Training the embedded model: the objective learns, runs resume exactly, the CLI refuses bad input."""

import random
import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoTokenizer, DiffusionGemmaForBlockDiffusion

from dgemma.embedded import corpus, train
from dgemma.embedded.tokenizer import build_tokenizer

pytestmark = pytest.mark.embedded  # trains the embedded model's architecture for a few steps


def test_a_few_training_steps_lower_the_loss():
    torch.manual_seed(0)
    torch.set_num_threads(1)
    tokenizer = build_tokenizer()
    encode = tokenizer.get_vocab()
    model = train.DiffusionGemmaForBlockDiffusion(train.build_config(len(encode), "tiny"))
    rng = random.Random(0)
    stream = corpus.training_stream(rng)
    held = train.batch_group(stream, encode, train.CANVAS_LENGTH, rng, 32, 1)[0]

    def held_loss() -> float:
        with torch.no_grad():
            return train.diffusion_loss(model, held, torch.Generator().manual_seed(1), self_condition=True).item()

    before = held_loss()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    generator = torch.Generator().manual_seed(0)
    for step in range(30):
        batch = train.batch_group(stream, encode, train.CANVAS_LENGTH, rng, 32, 1)[0]
        loss = train.diffusion_loss(model, batch, generator, self_condition=step % 2 == 0)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert held_loss() < before - 0.3


def tiny_run(out, *extra: str) -> None:
    args = ["--out", str(out), "--steps", "16", "--size", "tiny", "--batch-size", "8", "--seed", "5"]
    train.train(train.parse_args([*args, "--checkpoint-every", "0", *extra]))


def test_resumed_run_matches_an_uninterrupted_one_and_saves_a_loadable_model(tmp_path):
    tiny_run(tmp_path / "straight")
    tiny_run(tmp_path / "resumed", "--session-steps", "8")
    tiny_run(tmp_path / "resumed", "--resume")
    straight = load_file(tmp_path / "straight" / "model.safetensors")
    resumed = load_file(tmp_path / "resumed" / "model.safetensors")
    assert straight.keys() == resumed.keys()
    assert all(torch.equal(straight[k], resumed[k]) for k in straight)

    model = DiffusionGemmaForBlockDiffusion.from_pretrained(tmp_path / "resumed")
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "resumed")
    assert model.generation_config.max_denoising_steps == train.GENERATION_DEFAULTS["max_denoising_steps"]
    ids = tokenizer(["add 1+2"], return_tensors="pt").input_ids
    assert model.generate(ids, max_new_tokens=16).sequences.shape == (1, ids.shape[1] + 16)


@pytest.mark.parametrize("bad", [["--steps", "0"], ["--minutes", "-1"], [], ["--steps", "x"]])
def test_cli_rejects_a_bad_budget_with_exit_2_and_one_line(tmp_path, capsys, bad):
    with pytest.raises(SystemExit) as exit_:
        train.parse_args(["--out", str(tmp_path), *bad])
    assert exit_.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith("python -m dgemma.embedded.train: error:")
