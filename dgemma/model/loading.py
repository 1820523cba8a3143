"""Loading a DiffusionGemma checkpoint: the embedded default, a local directory, or a hub id.

Everything goes through transformers' `from_pretrained` with safetensors only and never
`trust_remote_code`. Before the weights are read, the model's size is estimated from its config
(accelerate's empty-weights init, no memory touched) and a checkpoint that cannot fit is refused
with one sentence instead of an allocator crash half-way through loading.

On CUDA the weights go straight to the GPU through accelerate's `device_map` (never a full host
copy first: the released checkpoint is ~52 GB in bf16); with several GPUs and no index given
they are sharded with `device_map="auto"`, each GPU keeping room for the sampler's transient.
A gated hub checkpoint reads the token from `HF_TOKEN` (huggingface_hub's own variable); a
missing token or an unaccepted license is one sentence saying what to do.

`load_format="dummy"` (vLLM's name) reads only the config and the tokenizer and builds random
weights of that shape on the device (`dgemma/model/dummy.py`); `facts()` then says "random weights".
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from dgemma.errors import first_line
from dgemma.memory import format_bytes, resolve_device
from dgemma.memory.ledger import ModelFacts
from dgemma.model.download import DownloadProgress, download_checkpoint
from dgemma.model.dummy import build_random_model
from dgemma.model.runner import PER_CANVAS, experts_mode_for, set_experts_mode

# Where a checkpoint comes from is decided without torch (app.py checks it before serving the page).
from dgemma.model.source import DEFAULT_MODEL, HUB_ID, ModelLoadError, is_embedded, public_name, resolve_source  # noqa: F401
from dgemma.sampling.budget import calibration_for

LOAD_FORMATS = ("auto", "dummy")
"""What `--load-format` accepts: auto, the checkpoint's safetensors; dummy, random weights of its config."""

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
"""What `--dtype` accepts besides "auto" (bf16 on CUDA, fp32 on CPU)."""

RESERVED_REQUESTS = 4
"""Sharded over several GPUs, each keeps room for the eager sampler step of this many requests
(its calibrated transient; at vocab 262,144 and canvas 256 about 0.54 GB each). The planner tiles
larger batches into what is free, so this is a floor, not the batch size."""


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
    load_format: str = "auto"  # "dummy": random weights of the config's shape
    experts: str = PER_CANVAS  # how the decoder runs many experts (dgemma/model/runner.py, EXPERT_MODES)

    @property
    def random_weights(self) -> bool:
        return self.load_format == "dummy"

    @property
    def embed_weight(self) -> torch.Tensor:
        return self.model.model.decoder.embed_tokens.weight

    @property
    def embed_scale(self) -> float:
        """The decoder's embedding normalizer (sqrt(hidden)): soft embeddings are scaled by it too."""
        return float(self.model.model.decoder.embed_tokens.scalar_embed_scale)

    def encode(self, prompt: str) -> list[int]:
        return encode_prompt(self.tokenizer, prompt)

    def ledger_facts(self, max_num_seqs: int, device: str | None = None) -> ModelFacts:
        """This model's figures for the memory ledger, as plain values, for an engine of `max_num_seqs`
        slots running its sampler on `device` (default: where the model loaded)."""
        dtype = self.embed_weight.dtype
        return ModelFacts(
            self.weight_bytes, self.canvas_length, self.vocab_size, self.hidden_size, str(dtype).removeprefix("torch."),
            kv_bytes_per_token(self.model.config, dtype), max_num_seqs, device or str(self.device),
            getattr(self.model, "final_logit_softcapping", None),
        )  # fmt: skip

    def encode_text(self, text: str) -> list[int]:
        """Token ids of output text (a canvas's start, a pinned piece): no template, no special tokens."""
        return [int(i) for i in self.tokenizer(text, add_special_tokens=False)["input_ids"]]

    def facts(self) -> dict:
        """What the page header and the `/info` endpoint say about the model (JSON-ready)."""
        return {
            "model": public_name(self.name), "embedded": is_embedded(self.name),
            "parameters": sum(p.numel() for p in self.model.parameters()),  # parameters() yields a tied weight once
            "dtype": str(self.dtype).removeprefix("torch."), "device": str(self.device), "vocab_size": self.vocab_size,
            "canvas_length": self.canvas_length, "hidden_size": self.hidden_size,
            "softcap": getattr(self.model, "final_logit_softcapping", None),
            "chat_template": bool(getattr(self.tokenizer, "chat_template", None)),
            "weights": "random" if self.random_weights else "checkpoint", "experts": self.experts,
            **({"note": RANDOM_WEIGHTS_NOTE} if self.random_weights else {}),
        }  # fmt: skip


RANDOM_WEIGHTS_NOTE = "random weights (--load-format dummy): the text is noise, not this model's"


def parse_dtype(text: str | torch.dtype | None, device: torch.device) -> torch.dtype:
    """`--dtype`: auto (None) is bf16 on CUDA and fp32 on CPU; else bfloat16, float16 or float32."""
    if isinstance(text, torch.dtype):
        return text
    if text is None or text == "auto":
        # fp32 on CPU (bf16 matmuls are slow there and change results); bf16 on CUDA like the release.
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if text not in DTYPES:
        raise ModelLoadError(f"unknown dtype {text!r}: use auto, {', '.join(DTYPES)}")
    return DTYPES[text]


def load_config(source: str, is_local: bool):
    """The DiffusionGemmaConfig of a checkpoint; a hub id is looked up in the local cache first."""
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(source, local_files_only=True, trust_remote_code=False)
    except (OSError, ValueError) as err:
        if is_local:
            raise ModelLoadError(f"cannot read the config in {source}: {first_line(err, 300)}") from None
    if os.environ.get("HF_HUB_OFFLINE") == "1":
        raise ModelLoadError(f"{source} is not in the local Hugging Face cache and HF_HUB_OFFLINE=1 forbids downloading it")
    host = hub_reachable()
    if host is not True:
        raise ModelLoadError(f"cannot reach the Hugging Face hub ({host}) to fetch {source}, and it is not in the local cache")
    try:
        return AutoConfig.from_pretrained(source, trust_remote_code=False)
    except Exception as err:  # noqa: BLE001 - network/hub errors come in many types; all mean the same to a user
        raise ModelLoadError(hub_error_sentence(source, err) or f"cannot fetch {source} from the Hugging Face hub "
                             f"(no network, or no such model): {first_line(err, 300)}") from None


def hub_error_sentence(source: str, err: BaseException) -> str | None:
    """One sentence naming what to do when the hub refused `source` (gated, or not found), else
    None. transformers wraps the hub's errors in OSError: the cause chain is searched for
    huggingface_hub's own classes."""
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    cause: BaseException | None = err
    while cause is not None and not isinstance(cause, RepositoryNotFoundError):
        cause = cause.__cause__ or cause.__context__
    page = f"https://huggingface.co/{source}"
    if isinstance(cause, GatedRepoError):
        status = getattr(getattr(cause, "response", None), "status_code", None)
        if status == 401 or not os.environ.get("HF_TOKEN"):  # 401: no token, or an invalid one
            return (f"{source} is gated: accept its license at {page} while logged in, then set HF_TOKEN "
                    "to an access token of that account (on a Space: a secret named HF_TOKEN)")
        return (f"{source} is gated and the account of HF_TOKEN has not been granted access: "
                f"accept the license at {page} with that account and wait for the approval")
    if isinstance(cause, RepositoryNotFoundError):
        return f"{source} is not on the Hugging Face hub: check the id, or set HF_TOKEN if it is a private model you can read"
    return None


def hub_reachable() -> bool | str:
    """True if the hub's host answers a TCP connect; else its host name. Saves a minute of retries."""
    import socket
    from urllib.parse import urlparse

    url = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    host, port = url.hostname or "huggingface.co", url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((host, port), timeout=3.0).close()
        return True
    except OSError:
        return host


def estimate_weight_bytes(config, dtype: torch.dtype) -> int:
    """Bytes the weights will take, from the config alone (meta tensors: nothing is allocated)."""
    from accelerate import init_empty_weights
    from transformers import AutoModel, DiffusionGemmaForBlockDiffusion

    with init_empty_weights():
        diffusion_gemma = config.model_type == "diffusion_gemma"
        meta = DiffusionGemmaForBlockDiffusion(config) if diffusion_gemma else AutoModel.from_config(config)
    meta.tie_weights()  # encoder and decoder share most weights: parameters() yields each once, as loading counts them
    return sum(p.numel() * (dtype.itemsize if p.is_floating_point() else p.element_size()) for p in meta.parameters())


def free_device_bytes(device: torch.device, memory_budget: int | None = None) -> int:
    """What a checkpoint may use: the virtual budget if one is given, else the device's free memory."""
    if memory_budget is not None:
        return int(memory_budget)
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    import psutil

    return int(psutil.virtual_memory().available)


def sampler_reserve_bytes(config) -> int:
    """The eager sampler step's transient for RESERVED_REQUESTS requests in one tile (the ledger's tile
    term), calibrated on meta tensors at this checkpoint's canvas and vocabulary (no memory touched)."""
    text = config.text_config
    facts = ModelFacts(0, int(config.canvas_length), int(text.vocab_size), int(text.hidden_size), "bfloat16", 0,
                       RESERVED_REQUESTS, "cuda", getattr(text, "final_logit_softcapping", None))
    return calibration_for(facts).tile_bytes(RESERVED_REQUESTS)


def kv_bytes_per_token(config, dtype) -> int:
    """A token's keys and values over every decoder layer (full-attention layers may have heads of their own)."""
    text = getattr(config, "text_config", config)
    spec = vars(text).get("_heterogeneity_spec")
    if spec is not None and spec.per_layer_attributes:  # transformers' per-layer config: each layer's own heads
        return sum(2 * layer.num_key_value_heads * layer.head_dim for layer in text.per_layer_config) * dtype.itemsize
    head = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    kinds = getattr(text, "layer_types", None) or ["sliding_attention"] * text.num_hidden_layers
    total = 0
    for kind in kinds:
        dim, heads = head, text.num_key_value_heads
        if kind == "full_attention":
            dim = getattr(text, "global_head_dim", None) or dim
            heads = getattr(text, "num_global_key_value_heads", None) or heads
        total += 2 * heads * dim
    return total * dtype.itemsize


def placement(device: torch.device, config, memory_budget: int | None) -> tuple[dict, int]:
    """from_pretrained's placement kwargs and the bytes the weights may take there.

    CPU: none (the weights load in host memory, as they always did). One CUDA device (or an index
    given): `device_map` onto it, so the weights stream from disk to the GPU. Several GPUs and no
    index: `device_map="auto"` with `max_memory` leaving each GPU the sampler's reserve.
    """
    if device.type != "cuda":
        return {}, free_device_bytes(device, memory_budget)
    if device.index is None and torch.cuda.device_count() > 1 and memory_budget is None:
        reserve = sampler_reserve_bytes(config)
        room = {i: max(0, int(torch.cuda.mem_get_info(i)[0]) - reserve) for i in range(torch.cuda.device_count())}
        return {"device_map": "auto", "max_memory": room}, sum(room.values())
    index = device.index if device.index is not None else torch.cuda.current_device()
    return {"device_map": {"": index}}, free_device_bytes(torch.device("cuda", index), memory_budget)


def load_model(name: str | None = None, device: str | torch.device | None = None, dtype: torch.dtype | str | None = None,
               memory_budget: int | None = None, progress: DownloadProgress | None = None, load_format: str = "auto",
               experts: str = "auto") -> LoadedModel:
    """Load a DiffusionGemma checkpoint for serving; raise ModelLoadError with one sentence on failure.

    A hub id's files are fetched first (`download_checkpoint`), `progress` following the bytes.
    `load_format` "dummy": only the config and tokenizer are read, the weights are random, built on
    the device. `experts`: per_canvas, whole_batch, or auto (the device's default, `experts_mode_for`)."""
    from transformers import AutoTokenizer, DiffusionGemmaForBlockDiffusion

    source, is_local = resolve_source(name)
    try:
        device = resolve_device("auto" if device is None else str(device))
    except ValueError as err:
        raise ModelLoadError(str(err)) from None
    if device.type not in ("cpu", "cuda"):
        raise ModelLoadError(f"unknown device {str(device)!r}: use auto, cpu or cuda")
    dtype = parse_dtype(dtype, device)
    if load_format not in LOAD_FORMATS:
        raise ModelLoadError(f"unknown load format {load_format!r}: use {' or '.join(LOAD_FORMATS)}")
    try:
        experts = experts_mode_for(experts, device)
    except ValueError as err:
        raise ModelLoadError(str(err)) from None
    dummy = load_format == "dummy"
    if dummy and not is_local:
        raise ModelLoadError(f"--load-format dummy needs a directory with config.json and a tokenizer, not {source}")

    config = load_config(source, is_local)
    if config.model_type != "diffusion_gemma":
        raise ModelLoadError(f"{source} is a {config.model_type!r} checkpoint, not a DiffusionGemma one")
    weight_bytes = estimate_weight_bytes(config, dtype)
    where, room = placement(device, config, memory_budget)
    if weight_bytes > room:
        raise ModelLoadError(f"{source} needs {format_bytes(weight_bytes)} for its weights but only {format_bytes(room)} "
                             f"is free on {device.type}{' under the memory budget' if memory_budget else ''}")

    kwargs: dict = dict(dtype=dtype, use_safetensors=True, trust_remote_code=False, local_files_only=True, **where)
    try:
        files = source if is_local else download_checkpoint(source, progress)
        tokenizer = AutoTokenizer.from_pretrained(files, local_files_only=True, trust_remote_code=False)
        if dummy:
            model = build_random_model(config, dummy_device(device, where), dtype)
        else:
            model = DiffusionGemmaForBlockDiffusion.from_pretrained(files, **kwargs)
    except torch.OutOfMemoryError as err:
        raise ModelLoadError(f"random weights of {source} do not fit on {device.type}: {first_line(err, 200)}") from None
    except Exception as err:  # noqa: BLE001 - surface any loader failure as one sentence
        raise ModelLoadError(hub_error_sentence(source, err) or f"cannot load {source}: {first_line(err, 300)}") from None
    model.eval().requires_grad_(False)
    set_experts_mode(model, experts)

    text = config.text_config
    eos = text.eos_token_id if text.eos_token_id is not None else tokenizer.eos_token_id
    eos_ids = tuple(eos) if isinstance(eos, (list, tuple)) else ((eos,) if eos is not None else ())
    return LoadedModel(
        model=model, tokenizer=tokenizer, name=str(name or DEFAULT_MODEL), device=next(model.parameters()).device,
        dtype=dtype, canvas_length=int(config.canvas_length), vocab_size=int(text.vocab_size),
        hidden_size=int(text.hidden_size), max_positions=int(text.max_position_embeddings), eos_token_ids=eos_ids,
        weight_bytes=weight_bytes, load_format=load_format, experts=experts,
    )  # fmt: skip


def dummy_device(device: torch.device, where: dict) -> torch.device:
    """Where random weights are built: the one device `placement` chose (a dummy model is not sharded)."""
    mapping = where.get("device_map")
    if isinstance(mapping, dict):
        return torch.device("cuda", mapping[""])
    if mapping == "auto":  # several GPUs: the current one
        return torch.device("cuda", torch.cuda.current_device())
    return device


def encode_prompt(tokenizer, prompt: str) -> list[int]:
    """Token ids for a user prompt: through the chat template when the tokenizer has one."""
    if getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=True, add_generation_prompt=True,
                                            return_dict=True)["input_ids"]
        return [int(i) for i in ids]
    return [int(i) for i in tokenizer(prompt, add_special_tokens=True)["input_ids"]]
