"""What every scheduler is (diffusers' way: one file each beside this one, one row each in
`SCHEDULER_TABLE`): its parameters' base (`SchedulerParams`), the figures phases 1-3 offer its rows
(`Offered`), what its phases 4-6 make of them (`Settled`), every scheduler's stopping rule
(`stop_test`, phases 5-6) and the classes behind each (`DenoisingScheduler`, `PlannedScheduler`).

A scheduler's file loads torch on its first step, not on import, so the settings (the page is served
before torch loads) read every scheduler's parameters. Its signatures name `SamplingParams`
(sampling/params.py) and `TileInputs` (sampling/primitives.py) without importing them: those import
the schedulers.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

from dgemma.sampling.bounds import Bound, check_typed, check_value


@dataclass(frozen=True)
class SchedulerParams:
    """A scheduler's own parameters: its file's subclass, `name` its row in SCHEDULER_TABLE (and the
    setting `scheduler`); its fields are settings of their own name, checked on construction against
    `BOUNDS` (numbers) and `CHOICES` (names)."""

    name: str = field(default="", init=False)
    BOUNDS: ClassVar[dict[str, Bound]] = {}
    CHOICES: ClassVar[dict[str, tuple[str, ...]]] = {}

    @classmethod
    def options(cls) -> tuple[str, ...]:
        """Its fields that are settings (all but `name`)."""
        return tuple(f.name for f in fields(cls) if f.init)

    def __post_init__(self) -> None:
        for f in fields(self):
            if f.init:
                check_typed(f.name, getattr(self, f.name), f.default, self.BOUNDS.get(f.name), self.CHOICES.get(f.name, ()))

    @classmethod
    def parse(cls, values: Mapping[str, Any]) -> dict[str, Any]:
        """Its options among `values` (text, JSON numbers or values) as its fields hold them."""
        return {f.name: check_value(f.name, values[f.name], f.default, cls.BOUNDS.get(f.name), cls.CHOICES.get(f.name, ()))
                for f in fields(cls) if f.init and f.name in values}


@dataclass(frozen=True)
class Phase:
    """Where one decoder forward falls in its request's plan for a canvas (`schedulers.phase`)."""

    step: int  # the predictor step (0-based) this forward is, or follows
    steps: int  # predictor steps per canvas (the scheduler's N)
    sweep: int = 0  # 0: the predictor step itself; j >= 1: its j-th corrector sweep

    @property
    def last(self) -> bool:
        return self.sweep == 0 and self.step >= self.steps - 1


@dataclass
class Offered:
    """What phases 1-3 offer a tile's rows [n, CL]: `draft`, the argmax of each row's distribution
    (the entropy bound's tempered one, the others' raw one); `proposed`, the token each position
    offers (the sample); `confidence`, its probability (block refinement's ranking; None where no
    row ranks by it); `entropy`; `renoise`, the keyed tokens of the positions not kept, drawn from
    `vocab_size` entries."""

    draft: torch.Tensor
    proposed: torch.Tensor
    confidence: torch.Tensor | None
    entropy: torch.Tensor
    renoise: torch.Tensor
    vocab_size: int

    def select(self, index: torch.Tensor) -> Offered:
        confidence = None if self.confidence is None else self.confidence[index]
        return Offered(self.draft[index], self.proposed[index], confidence, self.entropy[index], self.renoise[index],
                       self.vocab_size)


@dataclass
class Settled:
    """What phases 4-6 make of a tile's rows: the draft that commits, the next canvas, the accepted
    positions [n, CL], the new history [n, MAX_STABILITY, CL], the mean entropy and whether each
    row converged [n]; `committed`: block refinement's committed positions after the step (the
    input's, unchanged, for other rows; None in a tile that has none)."""

    draft: torch.Tensor
    next_canvas: torch.Tensor
    accepted: torch.Tensor
    history: torch.Tensor
    mean_entropy: torch.Tensor
    converged: torch.Tensor
    committed: torch.Tensor | None = None


def stop_test(draft: torch.Tensor, entropy: torch.Tensor, inputs: TileInputs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Phases 5-6, every scheduler's stopping rule: (new history, mean entropy, whether the row
    stops: its draft is stable and confident)."""
    import torch

    # ---- Phase 5: stability: the draft equals each of the last `stability_threshold` drafts
    same = (inputs.history == draft[:, None, :]).all(dim=-1) | ~inputs.history_valid
    stable = same.all(dim=-1)
    history = torch.cat([inputs.history[:, 1:], draft[:, None, :]], dim=1)

    # ---- Phase 6: convergence: stable and confident (mean entropy under the threshold); the caller adds the last step
    mean_entropy = entropy.mean(dim=-1)
    return history, mean_entropy, stable & (mean_entropy < inputs.confidence_threshold)


class DenoisingScheduler(ABC):
    """One scheduler: its parameters (`Params`), which rows sample, how it reads the distribution,
    how many corrector sweeps follow a predictor step, the kind of row it costs (`row_kind`) and
    its phases 4-6 (`settle`) on its own rows of a tile."""

    Params: ClassVar[type[SchedulerParams]]
    # Reads the raw distribution (temperature 1) and its place in a plan (`TileInputs.params`,
    # `phases`, `canvas`, `committed`); the entropy bound reads the tempered one and needs neither.
    reads_raw: ClassVar[bool] = True

    @abstractmethod
    def samples(self, params: SamplingParams) -> bool:
        """Whether a request with `params` draws its proposals (else they are the argmax)."""

    def sweeps(self, params: SamplingParams) -> int:
        """Corrector sweeps after each corrected predictor step (only discrete DDIM has them)."""
        return 0

    def row_kind(self, params: SamplingParams) -> str:
        """The costliest row (a key of `calibration.COSTLIEST`) a request with `params` puts in a tile,
        for the tiles' calibration: a corrector sweep's ("sweep": its logits whole, in float64), a
        raw-reading row's at a temperature ("tempered": a second pass over the vocabulary), or a
        sampling row's ("sample": greedy rows cost no more)."""
        if self.sweeps(params) > 0:
            return "sweep"
        return "tempered" if self.reads_raw and self.samples(params) else "sample"

    @abstractmethod
    def settle(self, inputs: TileInputs, offered: Offered) -> Settled:
        """Phases 4-6 on rows that are all this scheduler's predictor rows."""


class PlannedScheduler(DenoisingScheduler):
    """A scheduler that reads a plan of `max_denoising_steps` predictor steps: the stopping rule,
    then its own `advance` of the canvas; a row that stops commits its argmax, one at its last
    predictor step its canvas. Its parameters hold a `temperature`: above 0 it samples its proposals."""

    def samples(self, params: SamplingParams) -> bool:
        return params.scheduler.temperature > 0

    @abstractmethod
    def advance(self, inputs: TileInputs, offered: Offered) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """(next canvas, accepted positions, committed positions after) of the rows' predictor step."""

    def settle(self, inputs: TileInputs, offered: Offered) -> Settled:
        import torch

        draft = offered.draft if inputs.pins is None else torch.where(inputs.pins >= 0, inputs.pins, offered.draft)
        history, mean_entropy, stops = stop_test(draft, offered.entropy, inputs)
        next_canvas, accepted, committed = self.advance(inputs, offered)
        draft = torch.where((inputs.last_step & ~stops)[:, None], next_canvas, draft)
        return Settled(draft, next_canvas, accepted, history, mean_entropy, stops | inputs.last_step, committed)
