"""`python -m dgemma.embedded.train`: train the embedded DiffusionGemma on the project's own corpus.

Objective (uniform renoising, the one generate()'s sampler undoes): pick one canvas of an answer,
draw a noise level t ~ U(0, 1), replace each canvas token by a uniform random token with
probability t, and take the cross-entropy of the decoder's logits against the clean canvas. The
encoder context is the prompt plus the clean canvases before the chosen one, exactly what
generate() has committed to the KV cache when it denoises that canvas. On about half the batches
a first, gradient-free pass's logits are fed back as `self_conditioning_logits`, as generate()
feeds each step's logits to the next.

Seeded and resumable: `--resume` continues from OUT/checkpoint.pt until the budget (steps or
minutes, counted across sessions) is spent; the result is saved with `save_pretrained`.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm
from transformers import DiffusionGemmaConfig, DiffusionGemmaForBlockDiffusion
from transformers.models.diffusion_gemma.generation_diffusion_gemma import DiffusionGemmaGenerationConfig, EntropyBoundSamplerConfig

from dgemma.embedded import corpus
from dgemma.embedded.tokenizer import BOS_ID, EOS_ID, PAD_ID, build_tokenizer
from dgemma.model.release import MINIMAL_VISION

CANVAS_LENGTH = 16

# name -> (hidden, layers, heads, kv heads); "small" is the shipped model, "tiny" is for tests.
SIZES = {"tiny": (32, 2, 2, 1), "small": (128, 4, 4, 2)}

# Addition needs the most examples to learn carries; the multi-canvas families get a little extra.
FAMILY_WEIGHTS = {"count": 1.5, "add": 2.5, "reverse": 1.0, "sort": 1.0, "repeat": 1.0, "prose": 1.5}

# Diffusion defaults for this model, tuned with `python -m dgemma.embedded.eval` (see docs/model.md).
GENERATION_DEFAULTS = dict(max_new_tokens=64, max_denoising_steps=32, t_min=0.4, t_max=0.8, stability_threshold=1,
                           confidence_threshold=0.005, entropy_bound=0.1)
SPECIAL_TOKENS = dict(pad_token_id=PAD_ID, eos_token_id=EOS_ID, bos_token_id=BOS_ID)


def build_config(vocab_size: int, size: str = "small", canvas_length: int = CANVAS_LENGTH) -> DiffusionGemmaConfig:
    hidden, layers, heads, kv_heads = SIZES[size]
    head_dim = hidden // heads
    text_config = dict(
        vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim, global_head_dim=head_dim,
        max_position_embeddings=512, sliding_window=512,
        # Gemma's pattern in miniature: sliding layers, then one full-attention layer last.
        layer_types=["sliding_attention"] * (layers - 1) + ["full_attention"],
        # Full rotary on every layer: character tasks (reverse, count) live on exact positions, and
        # Gemma's proportional rope rotates only a quarter of a 32-wide head.
        rope_parameters={kind: {"rope_type": "default", "rope_theta": 10_000.0}
                         for kind in ("sliding_attention", "full_attention")},
        num_experts=2, top_k_experts=1, moe_intermediate_size=hidden, **SPECIAL_TOKENS,
    )
    # The architecture requires a vision tower; this one is minimal and never used.
    vision_config = {**MINIMAL_VISION, "patch_size": 4, "position_embedding_size": 16}
    return DiffusionGemmaConfig(text_config=text_config, vision_config=vision_config, canvas_length=canvas_length)


def generation_config(**overrides: float | int) -> DiffusionGemmaGenerationConfig:
    values = {**GENERATION_DEFAULTS, **overrides}
    bound = EntropyBoundSamplerConfig(entropy_bound=float(values.pop("entropy_bound")))
    return DiffusionGemmaGenerationConfig(**values, sampler_config=bound, **SPECIAL_TOKENS)


# --- batches ------------------------------------------------------------------------------


@dataclass
class Batch:
    encoder_ids: torch.Tensor  # [B, L] prompt + clean earlier canvases, left-padded
    encoder_mask: torch.Tensor  # [B, L] bool, False on padding
    target: torch.Tensor  # [B, CL] the clean canvas to denoise


def answer_ids(answer: str, encode: dict[str, int], canvas_length: int) -> list[int]:
    """Answer tokens + EOS, padded to whole canvases (generate() pads every position after EOS)."""
    ids = [encode[c] for c in answer] + [EOS_ID]
    return ids + [PAD_ID] * (-len(ids) % canvas_length)


def pick_canvas(example: corpus.Example, encode: dict[str, int], canvas_length: int, rng: random.Random):
    """(encoder ids, target canvas) for one canvas of one example."""
    prompt = [BOS_ID] + [encode[c] for c in example.prompt]
    answer = answer_ids(example.answer, encode, canvas_length)
    n_canvases = len(answer) // canvas_length
    # Now and then the all-pad canvas after the end: batched generate() keeps denoising rows that
    # have finished, and they should settle at once rather than wander for max steps.
    k = n_canvases if rng.random() < 0.05 else rng.randrange(n_canvases)
    context = prompt + answer[: k * canvas_length]
    target = answer[k * canvas_length : (k + 1) * canvas_length] or [PAD_ID] * canvas_length
    return context, target


def collate(items: list[tuple[list[int], list[int]]]) -> Batch:
    # Left padding, as generate() does for a batch: the last real token sits right before the canvas.
    width = max(len(context) for context, _ in items)
    ids = torch.full((len(items), width), PAD_ID, dtype=torch.long)
    mask = torch.zeros((len(items), width), dtype=torch.bool)
    for row, (context, _) in enumerate(items):
        ids[row, width - len(context) :] = torch.tensor(context)
        mask[row, width - len(context) :] = True
    target = torch.tensor([t for _, t in items], dtype=torch.long)
    return Batch(ids, mask, target)


def batch_group(stream, encode: dict[str, int], canvas_length: int, rng: random.Random, batch_size: int,
                n_batches: int) -> list[Batch]:
    """`n_batches` batches whose rows are bucketed by context length, so little compute goes to padding."""
    items = [pick_canvas(next(stream), encode, canvas_length, rng) for _ in range(batch_size * n_batches)]
    items.sort(key=lambda item: len(item[0]))
    batches = [collate(items[i : i + batch_size]) for i in range(0, len(items), batch_size)]
    rng.shuffle(batches)
    return batches


# --- the objective ------------------------------------------------------------------------


def noise(target: torch.Tensor, vocab_size: int, generator: torch.Generator) -> torch.Tensor:
    """Uniform renoising: each token becomes a uniform random token with probability t ~ U(0, 1)."""
    t = torch.rand(target.shape[0], 1, generator=generator)
    replace = torch.rand(target.shape, generator=generator) < t
    random_tokens = torch.randint(0, vocab_size, target.shape, generator=generator)
    return torch.where(replace, random_tokens, target)


def diffusion_loss(model: DiffusionGemmaForBlockDiffusion, batch: Batch, generator: torch.Generator,
                   self_condition: bool) -> torch.Tensor:
    vocab_size = model.config.text_config.vocab_size
    noisy = noise(batch.target, vocab_size, generator)
    canvas_mask = torch.ones_like(batch.target, dtype=torch.bool)
    inputs = dict(input_ids=batch.encoder_ids, attention_mask=batch.encoder_mask, decoder_input_ids=noisy,
                  decoder_attention_mask=torch.cat([batch.encoder_mask, canvas_mask], dim=1))
    self_conditioning_logits = None
    if self_condition:
        with torch.no_grad():
            first = model(**inputs).logits
        # generate() feeds back temperature-scaled logits (t in [t_min, t_max]); match that range.
        temperature = torch.empty(first.shape[0], 1, 1).uniform_(0.4, 0.8, generator=generator)
        self_conditioning_logits = first / temperature
    logits = model(**inputs, self_conditioning_logits=self_conditioning_logits).logits
    return F.cross_entropy(logits.reshape(-1, vocab_size), batch.target.reshape(-1))


# --- the loop -----------------------------------------------------------------------------


def learning_rate(progress: float, peak: float, warmup: float = 0.03) -> float:
    """Linear warmup, then cosine decay to a tenth of the peak."""
    if progress < warmup:
        return peak * progress / warmup
    cosine = 0.5 * (1 + math.cos(math.pi * min(1.0, (progress - warmup) / (1 - warmup))))
    return peak * (0.1 + 0.9 * cosine)


@dataclass
class TrainState:
    step: int = 0
    elapsed: float = 0.0  # seconds trained, across resumed sessions


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m dgemma.embedded.train", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="model directory to write")
    parser.add_argument("--minutes", type=float, default=None, help="training budget in minutes (total)")
    parser.add_argument("--steps", type=int, default=None, help="training budget in optimizer steps (total)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--resume", action="store_true", help="continue from OUT/checkpoint.pt if present")
    parser.add_argument("--size", choices=sorted(SIZES), default="small")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--checkpoint-every", type=float, default=120.0, help="seconds between checkpoints")
    parser.add_argument("--session-steps", type=int, default=None, help="stop this session after this many steps (resume later)")
    args = parser.parse_args(argv)
    if args.minutes is None and args.steps is None:
        parser.error("give a budget: --minutes and/or --steps")
    for name in ("minutes", "steps", "batch_size", "lr", "threads", "session_steps"):
        value = getattr(args, name)
        if value is not None and value <= 0:
            parser.error(f"--{name.replace('_', '-')} must be positive, got {value}")
    return args


def train(args: argparse.Namespace) -> float:
    """Train to budget, save the model to args.out, and return the last logged loss."""
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    tokenizer = build_tokenizer()
    encode = {token: i for token, i in tokenizer.get_vocab().items()}
    model = DiffusionGemmaForBlockDiffusion(build_config(len(encode), args.size))
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.99), weight_decay=0.01)
    data_rng = random.Random(args.seed)
    noise_generator = torch.Generator().manual_seed(args.seed)
    state = TrainState()

    args.out.mkdir(parents=True, exist_ok=True)
    checkpoint_path = args.out / "checkpoint.pt"
    if args.resume and checkpoint_path.exists():
        saved = torch.load(checkpoint_path, weights_only=False)
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        data_rng.setstate(saved["data_rng"])
        noise_generator.set_state(saved["noise_rng"])
        state = TrainState(**saved["state"])
        print(f"resumed at step {state.step} ({state.elapsed / 60:.1f} min trained)", flush=True)

    def progress() -> float:  # the larger share of the budgets given (at least one is)
        steps = state.step / args.steps if args.steps is not None else 0.0
        return max(steps, state.elapsed / (60 * args.minutes) if args.minutes is not None else 0.0)

    def save_model() -> None:
        model.generation_config = generation_config()
        model.save_pretrained(args.out)
        tokenizer.save_pretrained(args.out)

    def save_checkpoint() -> None:
        # The model goes out too, so a run in progress can be evaluated.
        save_model()
        torch.save(dict(model=model.state_dict(), optimizer=optimizer.state_dict(), data_rng=data_rng.getstate(),
                        noise_rng=noise_generator.get_state(), state=vars(state)), checkpoint_path)

    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: {args.size}, {n_params:,} parameters, vocab {len(encode)}, canvas {CANVAS_LENGTH}", flush=True)
    stream = corpus.training_stream(data_rng, FAMILY_WEIGHTS)
    group_size = 8  # batches per length bucket; checkpoints land on group boundaries so resume is exact
    log = (args.out / "train_log.jsonl").open("a")
    bar = tqdm(total=1000, desc="train", unit="‰", initial=int(1000 * progress()), mininterval=10)
    smoothed, last_checkpoint = None, time.monotonic()
    session_end = state.step + args.session_steps if args.session_steps else None

    def done() -> bool:
        return progress() >= 1 or state.step == session_end

    model.train()
    while not done():
        for batch in batch_group(stream, encode, CANVAS_LENGTH, data_rng, args.batch_size, group_size):
            start = time.monotonic()
            lr = learning_rate(progress(), args.lr)
            for group in optimizer.param_groups:
                group["lr"] = lr
            self_condition = torch.rand((), generator=noise_generator).item() < 0.5
            loss = diffusion_loss(model, batch, noise_generator, self_condition)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            state.step += 1
            state.elapsed += time.monotonic() - start
            smoothed = loss.item() if smoothed is None else 0.98 * smoothed + 0.02 * loss.item()
            bar.n = min(1000, int(1000 * progress()))
            bar.set_postfix(step=state.step, loss=f"{smoothed:.4f}", lr=f"{lr:.1e}", refresh=False)
            if state.step % 25 == 0:
                record = dict(step=state.step, loss=round(smoothed, 5), lr=lr, minutes=round(state.elapsed / 60, 2))
                log.write(json.dumps(record) + "\n")
                log.flush()
                tqdm.write(json.dumps(record))
            if done():
                break
        if time.monotonic() - last_checkpoint > args.checkpoint_every or done():
            save_checkpoint()
            last_checkpoint = time.monotonic()
    bar.close()

    model.eval()
    save_model()
    print(f"saved {args.out} after {state.step} steps, {state.elapsed / 60:.1f} min, loss {smoothed:.4f}", flush=True)
    return float(smoothed)


def main(argv: list[str] | None = None) -> int:
    train(parse_args(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
