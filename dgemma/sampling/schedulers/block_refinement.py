"""Block refinement (diffusers 0.42.1's): the canvas holds committed positions (`committed`, per
slot, reset at a canvas's start; a pinned position counts as committed and holds its token). A step
commits what the cumulative quota still owes (ceil((step + 1) CL / N) in all), the most confident
first, plus every position above `commit_threshold`; with `editing_threshold` a committed token the
model now replaces with confidence above it is edited; the rest is re-noised with keyed tokens.

It reads the RAW distribution (temperature 1): its argmax (the draft), its entropy (the stopping
rule), its self-conditioning embedding and the confidence p(token). With `temperature` > 0 the
token each position proposes is drawn from softmax(logits / T) instead (the block race, keyed), its
confidence the tempered probability, as diffusers does."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from dgemma.sampling.bounds import Bound
from dgemma.sampling.schedulers.base import Offered, PlannedScheduler, SchedulerParams


@dataclass(frozen=True)
class BlockRefinementParams(SchedulerParams):
    """temperature: the sample's (0: argmax); commit_threshold: diffusers' `threshold`;
    editing_threshold: None, no editing (any number, 0 included, edits as diffusers does)."""

    name: str = field(default="block_refinement", init=False)
    temperature: float = 0.0
    commit_threshold: float = 0.95
    editing_threshold: float | None = None
    BOUNDS = {"temperature": Bound(float, 0.0, 10.0), "commit_threshold": Bound(float, 0.0, 1.0),
              "editing_threshold": Bound(float, 0.0, 1.0)}


class BlockRefinement(PlannedScheduler):
    Params = BlockRefinementParams

    def advance(self, inputs: TileInputs, offered: Offered) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """One step on rows [r, CL]: (next canvas, newly committed, committed after), from the rows'
        proposed tokens and their probabilities (fp32), the canvas the decoder read and the
        positions committed before this step."""
        import torch

        proposed, confidence, canvas, committed = offered.proposed, offered.confidence, inputs.canvas, inputs.committed
        device, canvas_length = canvas.device, canvas.shape[-1]
        step = torch.tensor([p.step for p in inputs.phases], device=device)
        total = torch.tensor([p.steps for p in inputs.phases], device=device)
        options = [q.scheduler for q in inputs.params]
        threshold = torch.tensor([q.commit_threshold for q in options], dtype=torch.float32, device=device)
        editing = torch.tensor([math.nan if q.editing_threshold is None else q.editing_threshold for q in options],
                               dtype=torch.float32, device=device)  # nan: no edit passes the test
        if inputs.pins is not None:
            held = inputs.pins >= 0
            proposed = torch.where(held, inputs.pins, proposed)  # a pin is committed: no edit changes it
        # The cumulative quota: an even share of the canvas per step, what is still owed committed now
        target = ((step + 1) * canvas_length + total - 1) // total
        needed = (target - committed.sum(dim=-1)).clamp(min=0)
        masked = confidence.masked_fill(committed, float("-inf"))
        ranks = masked.argsort(dim=-1, descending=True).argsort(dim=-1)
        transfer = ~committed & ((ranks < needed[:, None]) | (confidence > threshold[:, None]))
        edit = committed & (proposed != canvas) & (confidence > editing[:, None])
        after = committed | transfer
        next_canvas = torch.where(after, torch.where(transfer | edit, proposed, canvas), offered.renoise)
        if inputs.pins is not None:
            next_canvas = torch.where(held, inputs.pins, next_canvas)
        return next_canvas, transfer, after
