"""Random weights of a checkpoint's shape, built where they will run: `--load-format dummy`.

vLLM's name for it: the model of a config, its weights random, nothing read but the config and
the tokenizer. The model's parameters are built on the meta device (shapes only, in their dtype), then every
distinct one is allocated once on the target device (tied weights stay one tensor: building on
the device directly allocated twice the weights at its peak on a CPU, and initialised them three
times) and filled once by the model's own initialisation (`initialize_weights`), under a fixed
seed, so a dummy model is the same model every time it is built on the same device. No host copy
of a weight, no cast; only the buffers (rotary tables and scalars, a few KB computed from the
config) are made on the host and moved.

One change to that initialisation: the tied embedding (which is also the LM head) gets standard
deviation 1, so the logits spread over about ±15 as a trained model's do; at the default 0.02
every position's distribution over 262,144 tokens is flat to 1e-6 and which positions the
entropy bound accepts would hinge on rounding.
"""

from __future__ import annotations

import torch

DUMMY_SEED = 0


def build_random_model(config, device: torch.device | str, dtype: torch.dtype, seed: int = DUMMY_SEED):
    """A DiffusionGemmaForBlockDiffusion of `config` with random weights on `device` in `dtype`
    (device "meta": shapes only, what a size estimate or a structural test needs)."""
    from transformers import DiffusionGemmaForBlockDiffusion

    from accelerate import init_empty_weights

    device = torch.device(device)
    # Parameters on meta; buffers (rotary tables, scalars: a few KB, computed from the config) real.
    with init_empty_weights(include_buffers=device.type == "meta"):
        model = DiffusionGemmaForBlockDiffusion._from_config(config, dtype=dtype)
    model.tie_weights()  # each meta parameter was registered anew: tie the shared ones again, still on meta
    if device.type == "meta":
        return model.eval().requires_grad_(False)
    materialize(model, device)
    for module in model.modules():  # the meta build marked each module initialised: its init ran on no memory
        module.__dict__.pop("_is_hf_initialized", None)
    torch.manual_seed(seed)  # seeds every device's generator, CUDA's too
    with torch.no_grad():
        model.initialize_weights()
        model.model.decoder.embed_tokens.weight.normal_(0.0, 1.0)
    return model.eval().requires_grad_(False)


def materialize(model: torch.nn.Module, device: torch.device) -> None:
    """Every distinct meta parameter of `model` allocated (uninitialised) on `device`, each module
    that shared one sharing the new one; the buffers moved there as they are."""
    made: dict[int, torch.Tensor] = {}
    allocate = (lambda meta: torch.nn.Parameter(torch.empty_like(meta, device=device), requires_grad=False),
                lambda buffer: buffer.to(device))
    for module in model.modules():
        for table, make in zip((module._parameters, module._buffers), allocate):
            for name, tensor in list(table.items()):
                if tensor is not None:
                    if id(tensor) not in made:
                        made[id(tensor)] = make(tensor)
                    table[name] = made[id(tensor)]
