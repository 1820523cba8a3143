"""The entropy bound (transformers' DiffusionGemma sampler): a step accepts the lowest-entropy
positions while their summed entropy (less the largest) stays under the bound; the rest is re-noised
with keyed tokens. It reads the tempered distribution (t_min to t_max over the plan) and samples
unless `greedy`: those and `entropy_bound` are the request's own (`SamplingParams`), as the model's
generation config gives them, so its parameters hold nothing more."""

from __future__ import annotations

from dataclasses import dataclass, field

from dgemma.sampling.schedulers.base import DenoisingScheduler, Offered, SchedulerParams, Settled, stop_test


@dataclass(frozen=True)
class EntropyBoundParams(SchedulerParams):
    name: str = field(default="entropy_bound", init=False)


class EntropyBound(DenoisingScheduler):
    Params = EntropyBoundParams
    reads_raw = False

    def samples(self, params: SamplingParams) -> bool:
        return not params.greedy

    def settle(self, inputs: TileInputs, offered: Offered) -> Settled:
        """A pinned position (`inputs.pins`) holds its token in the draft, the sample and the next
        canvas, and counts as accepted; its entropy stays the model's."""
        import torch

        draft, sampled, entropy = offered.draft, offered.proposed, offered.entropy
        if inputs.pins is not None:
            held = inputs.pins >= 0
            draft, sampled = torch.where(held, inputs.pins, draft), torch.where(held, inputs.pins, sampled)
        # ---- Phase 4: entropy-bound acceptance; re-noise the rest
        sorted_ent, sorted_idx = torch.sort(entropy, dim=-1, stable=True)
        cumsum_ent = torch.cumsum(sorted_ent, dim=-1)
        cummax_ent = torch.cummax(sorted_ent, dim=-1).values
        sorted_mask = (cumsum_ent - cummax_ent) <= inputs.entropy_bound[:, None]
        accepted = torch.zeros_like(sorted_mask).scatter_(1, sorted_idx, sorted_mask)
        if inputs.pins is not None:
            accepted |= held
        next_canvas = torch.where(accepted, sampled, offered.renoise)

        history, mean_entropy, stops = stop_test(draft, entropy, inputs)
        return Settled(draft, next_canvas, accepted, history, mean_entropy, stops | inputs.last_step, inputs.committed)
