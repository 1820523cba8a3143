"""What every step implementation shares: its inputs (`Scores`, `TileInputs`) and its output
(`TileResult`), on [n, CL] tensors (docs/design.md); each scheduler's phases 4-6 are in
sampling/schedulers/."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from typing import Any

import torch

from dgemma.memory.repeats import Repeats
from dgemma.sampling.keyed import RowKey
from dgemma.sampling.params import MAX_STABILITY, SamplingParams
from dgemma.sampling.schedulers.base import Phase

PAD_LOGIT = -1.0e4  # exp(PAD_LOGIT - max) underflows to 0 in fp32; finite, so 0 * logp stays 0


@dataclass(frozen=True)
class LMHead:
    """The model's output projection: logits = softcap(hidden @ weight.T) in fp32 (as transformers).

    With `vocab_size` above the weight's rows the logits are padded to it with PAD_LOGIT (the
    lesson's real scale): a tile's [n, CL, vocab] tensors have that size, and padded entries get
    probability 0, so no token, entropy or soft-embedding weight comes from them."""

    weight: torch.Tensor  # [vocab, hidden]
    softcap: float | None = None
    vocab_size: int | None = None  # padded to this many entries; None: the weight's rows

    @property
    def vocab(self) -> int:
        return self.vocab_size or self.weight.shape[0]

    def project(self, hidden: torch.Tensor) -> torch.Tensor:
        """fp32 capped logits of the whole vocabulary for hidden states [..., hidden]."""
        return self.cap_(self.products(hidden))

    def products(self, hidden: torch.Tensor, start: int = 0, stop: int | None = None) -> torch.Tensor:
        """hidden @ weight[start:stop].T as a fresh fp32 tensor, not yet capped (`cap_`); padded
        entries are PAD_LOGIT."""
        rows = self.weight.shape[0]
        stop = self.vocab if stop is None else stop
        if stop <= rows:
            weight = self.weight if start == 0 and stop == rows else self.weight[start:stop]
            return torch.nn.functional.linear(hidden, weight).float()
        out = torch.full((*hidden.shape[:-1], stop - start), PAD_LOGIT, dtype=torch.float32, device=hidden.device)
        if start < rows:
            out[..., : rows - start] = torch.nn.functional.linear(hidden, self.weight[start:])
        return out

    def cap_(self, products: torch.Tensor, temperature: torch.Tensor | None = None, start: int = 0) -> torch.Tensor:
        """The softcap on fp32 `products` (vocab entries from `start`) in place, divided by
        `temperature` (broadcastable to them) in the cap's last multiply; returns `products`.
        Padded entries stay PAD_LOGIT (a softcap would lift them to -softcap)."""
        real = self.weight.shape[0] - start
        view = products if real >= products.shape[-1] else products[..., : max(0, real)]
        if self.softcap is not None:
            view.div_(self.softcap).tanh_()
            view.mul_(self.softcap if temperature is None else self.softcap / temperature)
        elif temperature is not None:
            view.div_(temperature)
        return products


def pad_vocabulary(embed_weight: torch.Tensor, lm_head: LMHead, vocab_size: int) -> tuple[torch.Tensor, LMHead]:
    """The embedding and LM head of a vocabulary padded to `vocab_size`: padded rows of the
    embedding are zeros (a padded entry's probability is 0, so it adds no soft-embedding weight),
    the head's padded logits PAD_LOGIT. The embedding is the real size: so is the step's memory."""
    padded = torch.zeros(vocab_size, embed_weight.shape[1], dtype=embed_weight.dtype, device=embed_weight.device)
    padded[: embed_weight.shape[0]] = embed_weight.detach()
    return padded, replace(lm_head, vocab_size=vocab_size)


@dataclass(frozen=True)
class Scores:
    """What a tile samples from: logits [n, CL, vocab], or hidden states [n, CL, hidden] and the
    LM head that projects them (then no [n, CL, vocab] tensor need exist outside a tile)."""

    logits: torch.Tensor | None = None
    hidden: torch.Tensor | None = None
    head: LMHead | None = None

    @property
    def rows(self) -> int:
        return (self.logits if self.logits is not None else self.hidden).shape[0]

    @property
    def vocab_size(self) -> int:
        return self.logits.shape[-1] if self.logits is not None else self.head.vocab

    @classmethod
    def checked(cls, logits: torch.Tensor | None, hidden: torch.Tensor | None, n: int, canvas_length: int,
                vocab_size: int, head: LMHead | None) -> Scores:
        """A sampler step's input for `n` slots, checked against its canvas and vocabulary: logits
        [n, CL, vocab] (or [n x CL, vocab]), or hidden states [n, CL, hidden] with the sampler's `head`."""
        if (logits is None) == (hidden is None):
            raise ValueError("pass exactly one of logits or hidden")
        if hidden is not None:
            if head is None:
                raise ValueError("hidden states need a sampler built with an lm_head")
            if tuple(hidden.shape[:2]) != (n, canvas_length):
                raise ValueError(f"hidden of shape {tuple(hidden.shape)} do not match {n} slots x CL {canvas_length}")
            return cls(hidden=hidden, head=head)
        if logits.dim() == 2:
            logits = logits.view(n, canvas_length, -1)
        if logits.shape[0] != n or logits.shape[1] != canvas_length:
            raise ValueError(f"logits of shape {tuple(logits.shape)} do not match {n} slots x CL {canvas_length}")
        if logits.shape[2] != vocab_size:
            raise ValueError(f"logits vocab {logits.shape[2]} != sampler vocab {vocab_size}")
        return cls(logits=logits)

    def select(self, rows: slice | torch.Tensor) -> Scores:
        if self.logits is not None:
            return Scores(logits=self.logits[rows])
        return Scores(hidden=self.hidden[rows], head=self.head)

    def at(self, tokens: torch.Tensor) -> torch.Tensor:
        """The fp32 logits [n, CL] of one token per position (untempered): a gather, or the LM head
        applied to those tokens' rows only."""
        if self.logits is not None:
            return self.logits.gather(-1, tokens[..., None]).squeeze(-1).float()
        rows = self.head.weight.shape[0]
        products = (self.hidden * self.head.weight[tokens.clamp(max=rows - 1)]).float().sum(dim=-1)
        return self.head.cap_(products[..., None])[..., 0].masked_fill(tokens >= rows, PAD_LOGIT)

    def full(self) -> torch.Tensor:
        """The tile's fp32 logits over the whole vocabulary, untempered (the seed's step)."""
        return self.head.project(self.hidden) if self.logits is None else self.logits.float()

    def tempered_by_rows(
        self, temperature: torch.Tensor, start: int = 0, stop: int | None = None, rows: list[int] | None = None
    ) -> tuple[torch.Tensor, Callable[[int, int], torch.Tensor]]:
        """The fp32 logits of vocab entries [start, stop) (of the tile's rows `rows` only, when
        given) as a fresh buffer [r, CL, stop - start] the step may overwrite (the caller's logits
        are never written), not yet tempered, and `temper(lo, hi)`, which divides the buffer's
        flat rows [lo, hi) (a position's logits each) by their temperature in place, folded into
        the softcap's last multiply, and returns them. A caller that tempers a few rows just
        before its other passes over them keeps those passes in cache; each value is the same
        however the rows are split (the same operations on the same numbers)."""
        index = None if rows is None else torch.tensor(rows, device=temperature.device)
        if index is not None:
            temperature = temperature[index]
        canvas_length = (self.logits if self.logits is not None else self.hidden).shape[1]
        per_row = temperature.to(torch.float32).repeat_interleave(canvas_length)[:, None]
        if self.logits is None:  # the projection's fresh output, capped and tempered in place
            buffer = self.head.products(self.hidden if index is None else self.hidden[index], start, stop)
            flat = buffer.view(-1, buffer.shape[-1])
            return buffer, lambda lo, hi: self.head.cap_(flat[lo:hi], per_row[lo:hi], start)
        logits = self.logits if start == 0 and stop in (None, self.vocab_size) else self.logits[..., start:stop]
        if index is not None:  # the rows' copy is the buffer: one [rows, CL, width] tensor, not two
            buffer = logits.index_select(0, index).float()
            flat = buffer.view(-1, buffer.shape[-1])
            return buffer, lambda lo, hi: flat[lo:hi].div_(per_row[lo:hi])
        buffer = torch.empty(logits.shape, dtype=torch.float32, device=logits.device)
        flat, source = buffer.view(-1, buffer.shape[-1]), logits.reshape(-1, logits.shape[-1])  # a view: only CL and n merge
        return buffer, lambda lo, hi: torch.div(source[lo:hi], per_row[lo:hi], out=flat[lo:hi])


# A CPU's share of cache for one group of positions: of 1, 2, 4 and 8 MiB at vocab 262,144 (2
# shared cores, 1 MiB L2 each, 32 MiB L3), 2 MiB ran both kinds of the reference step's rows
# fastest in hand timings (the chunked step, in 32,768-wide chunks, takes the same).
CACHE_GROUP_BYTES = 2 << 20


def group_bytes_for(device: torch.device) -> int | None:
    """How a step takes a tile's positions on `device` (`TileInputs.group_bytes`): on a CPU in
    groups of `CACHE_GROUP_BYTES` of logits, so that its passes after the projection run in
    cache; elsewhere all at once (a GPU would pay a launch per op per group; a meta run measures
    a GPU)."""
    return CACHE_GROUP_BYTES if device.type == "cpu" else None


@dataclass
class TileInputs:
    """The per-row settings and state one tile reads (rows = requests in the tile)."""

    rows: list[RowKey]
    temperature: torch.Tensor  # [n] float32
    entropy_bound: torch.Tensor  # [n] float32
    confidence_threshold: torch.Tensor  # [n] float32
    last_step: torch.Tensor  # [n] bool: this step is the canvas's last allowed one
    history: torch.Tensor  # [n, MAX_STABILITY, CL] long: previous drafts, -1 where none
    history_valid: torch.Tensor  # [n, MAX_STABILITY] bool: which history entries count
    group_bytes: int | None = None  # the step takes positions in groups of this many bytes of logits; None: all at once
    pins: torch.Tensor | None = None  # [n, CL] long: a pinned position's token, -1 where free; None: no row pins
    # The position groups' bodies counted so far (memory/repeats.py): the sampler keeps one for all
    # its tiles, chunks and steps, so a group of a size it has counted once is charged from then on.
    repeats: Repeats | None = None
    # What the rows of a scheduler that reads its plan read (block refinement's, discrete DDIM's:
    # sampling/schedulers/); None in a tile of entropy-bound rows only. params / phases: each row's
    # settings and place in its plan; canvas: the canvas the decoder read; committed: block
    # refinement's committed positions.
    params: list[SamplingParams] | None = None
    phases: list[Phase] | None = None
    canvas: torch.Tensor | None = None  # [n, CL] long
    committed: torch.Tensor | None = None  # [n, CL] bool

    def select(self, rows: list[int]) -> TileInputs:
        """The inputs of the tile's rows `rows` only."""
        index = torch.tensor(rows, device=self.temperature.device)
        picked: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, torch.Tensor):
                picked[f.name] = value.index_select(0, index)
            elif isinstance(value, list):
                picked[f.name] = [value[i] for i in rows]
        return replace(self, **picked)


@dataclass
class TileResult:
    next_canvas: torch.Tensor  # [n, CL] long: accepted samples, the rest re-noised
    draft: torch.Tensor  # [n, CL] long: argmax canvas
    entropy: torch.Tensor  # [n, CL] float32
    accepted: torch.Tensor  # [n, CL] bool
    mean_entropy: torch.Tensor  # [n] float32
    converged: torch.Tensor  # [n] bool
    history: torch.Tensor  # [n, MAX_STABILITY, CL] long
    soft_embeds: torch.Tensor  # [n, CL, hidden]
    logprobs: torch.Tensor  # [n, CL] float32: log p(draft token)
    committed: torch.Tensor | None = None  # [n, CL] bool: block refinement's committed positions after the step


# What a step does to a group of positions: (tempered logits [positions, width], which it may
# overwrite; the group's span of the tile's flat positions) -> (figures [positions] each,
# weights [positions, width] for the soft embedding).
Positions = Callable[[torch.Tensor, slice], tuple[tuple[torch.Tensor, ...], torch.Tensor]]


def in_position_groups(
    scores: Scores, inputs: TileInputs, rows: list[int] | None, positions: Positions, start: int = 0, stop: int | None = None
) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
    """Phase 1 (temperature) and `positions` over the rows' positions and vocab entries
    [start, stop), a group at a time (`inputs.group_bytes`): every pass after the projection reads
    and writes one position's logits at a time, so in groups they run in a CPU's cache, and the
    weights take the logits' place (one [n, CL, width] buffer instead of two). Returns the
    figures [n, CL] and the weights [n, CL, width]."""
    logits, temper = scores.tempered_by_rows(inputs.temperature, start, stop, rows)
    n, canvas_length, width = logits.shape
    total, group = n * canvas_length, cache_group(n * canvas_length, width, inputs.group_bytes)
    if group == total:  # one group: the weights are a tensor of their own, and the logits go now
        figures, weights = positions(temper(0, total), slice(0, total))
    else:
        # groups of one size allocate alike: counted once (memory/repeats.py), whichever tile or chunk
        parts, repeats = [], inputs.repeats if inputs.repeats is not None else Repeats()
        for lo in range(0, total, group):
            hi = min(lo + group, total)
            with repeats.body((positions.__code__, hi - lo, width)) as keep:
                scaled = temper(lo, hi)
                group_figures, group_weights = positions(scaled, slice(lo, lo + group))
                scaled.copy_(group_weights)  # in cache; the group's own weights go now
                del group_weights, scaled
                keep(*group_figures)
            parts.append(group_figures)
        figures, weights = [torch.cat(f) for f in zip(*parts)], logits
    return tuple(f.view(n, canvas_length) for f in figures), weights.view(n, canvas_length, width)


def cache_group(positions: int, width: int, group_bytes: int | None) -> int:
    """Positions per group: as many as fill `group_bytes` of fp32 logits `width` wide (at least
    one), or all of them (None)."""
    return positions if group_bytes is None else max(1, min(positions, group_bytes // (width * 4)))


# A step implementation: (scores, inputs, embed_weight, normalizer) -> TileResult. Pure: it
# writes no state, so a tile that runs out of memory can be split and retried without a trace.
TileFn = Callable[[Scores, TileInputs, torch.Tensor, float], TileResult]
