"""Loading a DiffusionGemma checkpoint: the embedded default, a local directory, or a hub id.

Everything goes through transformers' `from_pretrained` with safetensors only and never
`trust_remote_code`. Before the weights are read, the model's size is estimated from its config
(accelerate's empty-weights init, no memory touched) and a checkpoint that cannot fit is refused
with one sentence instead of an allocator crash half-way through loading.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

# Where a checkpoint comes from is decided without torch (app.py checks it before serving the page).
from dgemma.model.source import DEFAULT_MODEL, HUB_ID, ModelLoadError, resolve_source  # noqa: E402,F401


@dataclass
class LoadedModel:
    """A model ready for the runner, plus the facts the engine needs about it."""

    model: torch.nn.Module  # DiffusionGemmaForBlockDiffusion, eval mode
    tokenizer: object  # a transformers tokenizer
    name: str  # what the user asked for (path or hub id)
    device: torch.device
    dtype: torch.dtype
    canvas_length: int
    vocab_size: int
    hidden_size: int
    max_positions: int
    eos_token_ids: tuple[int, ...]
    weight_bytes: int

    @property
    def embed_weight(self) -> torch.Tensor:
        return self.model.model.decoder.embed_tokens.weight

    @property
    def embed_scale(self) -> float:
        """The decoder's embedding normalizer (sqrt(hidden)): soft embeddings are scaled by it too."""
        return float(self.model.model.decoder.embed_tokens.scalar_embed_scale)

    def encode(self, prompt: str) -> list[int]:
        return encode_prompt(self.tokenizer, prompt)


def default_device() -> torch.device:
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def default_dtype(device: torch.device) -> torch.dtype:
    # fp32 on CPU (bf16 matmuls are slow there and change results); bf16 on CUDA like the release.
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def load_config(source: str, is_local: bool):
    """The DiffusionGemmaConfig of a checkpoint; a hub id is looked up in the local cache first."""
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(source, local_files_only=True, trust_remote_code=False)
    except (OSError, ValueError) as err:
        if is_local:
            raise ModelLoadError(f"cannot read the config in {source}: {_one_line(err)}") from None
    if os.environ.get("HF_HUB_OFFLINE") == "1":
        raise ModelLoadError(f"{source} is not in the local Hugging Face cache and HF_HUB_OFFLINE=1 forbids downloading it")
    host = hub_reachable()
    if host is not True:
        raise ModelLoadError(f"cannot reach the Hugging Face hub ({host}) to fetch {source}, and it is not in the local cache")
    try:
        return AutoConfig.from_pretrained(source, trust_remote_code=False)
    except Exception as err:  # noqa: BLE001 - network/hub errors come in many types; all mean the same to a user
        raise ModelLoadError(
            f"cannot fetch {source} from the Hugging Face hub (no network, or no such model): {_one_line(err)}"
        ) from None


def hub_reachable(timeout: float = 3.0) -> bool | str:
    """True if the hub's host answers a TCP connect; else its host name. Saves a minute of retries."""
    import socket
    from urllib.parse import urlparse

    url = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    host, port = url.hostname or "huggingface.co", url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((host, port), timeout=timeout).close()
        return True
    except OSError:
        return host


def estimate_weight_bytes(config, dtype: torch.dtype) -> int:
    """Bytes the weights will take, from the config alone (meta tensors: nothing is allocated)."""
    from accelerate import init_empty_weights
    from transformers import AutoModel, DiffusionGemmaForBlockDiffusion

    with init_empty_weights():
        if config.model_type == "diffusion_gemma":
            meta = DiffusionGemmaForBlockDiffusion(config)
        else:
            meta = AutoModel.from_config(config)
    meta.tie_weights()  # the encoder and decoder share most weights: count them once, as loading does
    seen: set[int] = set()
    total = 0
    for p in meta.parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        total += p.numel() * (dtype.itemsize if p.is_floating_point() else p.element_size())
    return total


def free_device_bytes(device: torch.device, memory_budget: int | None = None) -> int:
    """What a checkpoint may use: the virtual budget if one is given, else the device's free memory."""
    if memory_budget is not None:
        return int(memory_budget)
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    import psutil

    return int(psutil.virtual_memory().available)


def load_model(
    name: str | None = None,
    device: str | torch.device | None = None,
    dtype: torch.dtype | None = None,
    memory_budget: int | None = None,
) -> LoadedModel:
    """Load a DiffusionGemma checkpoint for serving; raise ModelLoadError with one sentence on failure."""
    from transformers import AutoTokenizer, DiffusionGemmaForBlockDiffusion

    source, is_local = resolve_source(name)
    asked = device
    try:
        device = torch.device(device) if device is not None else default_device()
    except (RuntimeError, TypeError):
        device = None
    if device is None or device.type not in ("cpu", "cuda"):
        raise ModelLoadError(f"unknown device {str(asked)!r}: use cpu or cuda")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ModelLoadError("device cuda was asked for but no CUDA GPU is available")
    dtype = dtype or default_dtype(device)

    config = load_config(source, is_local)
    if config.model_type != "diffusion_gemma":
        raise ModelLoadError(f"{source} is a {config.model_type!r} checkpoint, not a DiffusionGemma one")
    weight_bytes = estimate_weight_bytes(config, dtype)
    room = free_device_bytes(device, memory_budget)
    if weight_bytes > room:
        raise ModelLoadError(
            f"{source} needs {weight_bytes / 2**30:.2f} GiB for its weights but only {room / 2**30:.2f} GiB "
            f"is free on {device.type}{' under the memory budget' if memory_budget else ''}"
        )

    kwargs: dict = dict(dtype=dtype, use_safetensors=True, trust_remote_code=False, local_files_only=is_local)
    if device.type == "cuda" and torch.cuda.device_count() > 1:
        kwargs["device_map"] = "auto"  # shard across GPUs with accelerate
    try:
        model = DiffusionGemmaForBlockDiffusion.from_pretrained(source, **kwargs)
        tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=is_local, trust_remote_code=False)
    except Exception as err:  # noqa: BLE001 - surface any loader failure as one sentence
        raise ModelLoadError(f"cannot load {source}: {_one_line(err)}") from None
    if "device_map" not in kwargs:
        model = model.to(device)
    model.eval().requires_grad_(False)

    text = config.text_config
    eos = text.eos_token_id if text.eos_token_id is not None else tokenizer.eos_token_id
    eos_ids = tuple(eos) if isinstance(eos, (list, tuple)) else ((eos,) if eos is not None else ())
    return LoadedModel(
        model=model,
        tokenizer=tokenizer,
        name=str(name or DEFAULT_MODEL),
        device=next(model.parameters()).device,
        dtype=dtype,
        canvas_length=int(config.canvas_length),
        vocab_size=int(text.vocab_size),
        hidden_size=int(text.hidden_size),
        max_positions=int(text.max_position_embeddings),
        eos_token_ids=eos_ids,
        weight_bytes=weight_bytes,
    )


def encode_prompt(tokenizer, prompt: str) -> list[int]:
    """Token ids for a user prompt: through the chat template when the tokenizer has one."""
    if getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], tokenize=True, add_generation_prompt=True
        )
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):  # some versions return a BatchEncoding
            ids = ids["input_ids"]
        return [int(i) for i in ids]
    return [int(i) for i in tokenizer(prompt, add_special_tokens=True)["input_ids"]]


def _one_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return text[0][:300] if text else type(err).__name__
