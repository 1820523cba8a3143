"""What every step implementation shares: its inputs (`Scores`, `TileInputs`), its output
(`TileResult`) and phases 4-6 (`settle`), which run on [n, CL] tensors (docs/design.md)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from dgemma.sampling.keyed import RowKey
from dgemma.sampling.params import MAX_STABILITY



@dataclass(frozen=True)
class LMHead:
    """The model's output projection: logits = softcap(hidden @ weight.T) in fp32 (as transformers)."""

    weight: torch.Tensor  # [vocab, hidden]
    softcap: float | None = None

    def project(
        self, hidden: torch.Tensor, start: int = 0, stop: int | None = None, temperature: torch.Tensor | None = None
    ) -> torch.Tensor:
        """fp32 logits of vocab entries [start, stop) for hidden states [..., hidden]; with a
        `temperature` [n] (hidden [n, ...]) the logits divided by it, folded into the softcap's
        last multiply (one pass fewer)."""
        weight = self.weight if start == 0 and stop in (None, self.weight.shape[0]) else self.weight[start:stop]
        logits = torch.nn.functional.linear(hidden, weight).float()  # a fresh tensor: capped in place
        temp = None if temperature is None else temperature.view(-1, *([1] * (logits.dim() - 1)))
        if self.softcap is not None:
            logits.div_(self.softcap).tanh_()
            return logits.mul_(self.softcap if temp is None else self.softcap / temp)
        return logits if temp is None else logits.div_(temp)


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
        return self.logits.shape[-1] if self.logits is not None else self.head.weight.shape[0]

    def tile(self, start: int, stop: int) -> Scores:
        if self.logits is not None:
            return Scores(logits=self.logits[start:stop])
        return Scores(hidden=self.hidden[start:stop], head=self.head)

    def full(self) -> torch.Tensor:
        """The tile's fp32 logits over the whole vocabulary, untempered (the seed's step)."""
        return self.head.project(self.hidden) if self.logits is None else self.logits.float()

    def tempered(
        self, temperature: torch.Tensor, start: int = 0, stop: int | None = None, rows: list[int] | None = None
    ) -> torch.Tensor:
        """Tempered fp32 logits / temperature [n, CL, stop - start] of vocab entries [start, stop)
        (of the tile's rows `rows` only, when given), a fresh tensor the step may overwrite (the
        caller's logits are never written)."""
        if rows is not None:
            index = torch.tensor(rows, device=temperature.device)
            temperature = temperature[index]
        if self.logits is None:
            return self.head.project(self.hidden if rows is None else self.hidden[index], start, stop, temperature)
        logits = self.logits if start == 0 and stop in (None, self.vocab_size) else self.logits[..., start:stop]
        if rows is not None:  # the rows' copy is the result: one [rows, CL, width] tensor, not two
            return logits.index_select(0, index).div_(temperature[:, None, None].to(torch.float32))
        return torch.div(logits, temperature[:, None, None].to(torch.float32))


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


# A step implementation: (scores, inputs, embed_weight, normalizer) -> TileResult. Pure: it
# writes no state, so a tile that runs out of memory can be split and retried without a trace.
TileFn = Callable[[Scores, TileInputs, torch.Tensor, float], TileResult]


def settle(
    sampled: torch.Tensor,
    draft: torch.Tensor,
    entropy: torch.Tensor,
    inputs: TileInputs,
    renoise: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Phases 4-6 on [n, CL] tensors: returns (next canvas, accepted mask, new history,
    mean entropy, converged); `renoise` holds the tokens for the positions not accepted."""
    # ---- Phase 4: entropy-bound acceptance; re-noise the rest
    sorted_ent, sorted_idx = torch.sort(entropy, dim=-1, stable=True)
    cumsum_ent = torch.cumsum(sorted_ent, dim=-1)
    cummax_ent = torch.cummax(sorted_ent, dim=-1).values
    sorted_mask = (cumsum_ent - cummax_ent) <= inputs.entropy_bound[:, None]
    accepted = torch.zeros_like(sorted_mask).scatter_(1, sorted_idx, sorted_mask)
    next_canvas = torch.where(accepted, sampled, renoise)

    # ---- Phase 5: stability: the draft equals each of the last `stability_threshold` drafts
    same = (inputs.history == draft[:, None, :]).all(dim=-1) | ~inputs.history_valid
    stable = same.all(dim=-1)
    history = torch.cat([inputs.history[:, 1:], draft[:, None, :]], dim=1)

    # ---- Phase 6: convergence: stable and confident (mean entropy under the threshold), or the last step
    mean_entropy = entropy.mean(dim=-1)
    converged = (stable & (mean_entropy < inputs.confidence_threshold)) | inputs.last_step
    return next_canvas, accepted, history, mean_entropy, converged
