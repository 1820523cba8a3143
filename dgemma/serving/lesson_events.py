"""The lesson's batch told as the engine's event stream, so the page folds and draws it as it does a
run: one board (dgemma/ui/board.py), the same compact frames and the same overview of the batch.

Torch-free: dgemma/serving/lesson_run.py hands over plain lists (one host copy a step). A request is
its slot (request id = slot, the cards' #slot+1); each has one canvas. Per step: the call's TilePlan,
one StepEvent per request denoising, and a "done" RequestEvent for each canvas that converged; a run
that ran out of memory ends every open request with an "error" event saying so.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Callable, Sequence

from dgemma.events import Event, RequestEvent, StepEvent, TilePlan
from dgemma.sampling.params import SamplingParams


class LessonEvents:
    """The events of one lesson run: its prompts, their settings, and how tokens read."""

    def __init__(self, prompts: Sequence[str], params: Sequence[SamplingParams], piece: Callable[[int], str],
                 text: Callable[[list[int]], str]):
        self.prompts, self.params, self.piece, self.text = list(prompts), list(params), piece, text

    def start(self, canvases: list[list[int]], vocab: int) -> list[Event]:
        """Every request running, and its canvas's random start (step 0: entropy log(vocab), none accepted)."""
        uniform = array("f", [math.log(vocab)])[0]  # rounded to float32 as every step's entropy is
        events: list[Event] = [RequestEvent(i, "running", seed=p.seed, prompt=self.prompts[i])
                               for i, p in enumerate(self.params)]
        for i, canvas in enumerate(canvases):
            events.append(StepEvent(i, 0, 0, self.params[i].max_denoising_steps, tuple(canvas),
                                    tuple(self.piece(t) for t in canvas), (uniform,) * len(canvas),
                                    (False,) * len(canvas), uniform, self.params[i].confidence_threshold, False))
        return events

    def step(self, plan: TilePlan | None, slots: Sequence[int], step: int, drafts: list[list[int]],
             entropies: list[list[float]], accepted: list[list[bool]], means: list[float], converged: list[bool],
             logprobs: Callable[[int], list[float]]) -> list[Event]:
        """One sampler call: its plan, each request's draft, and the canvases it committed."""
        events: list[Event] = [plan] if plan is not None else []
        for row, slot in enumerate(slots):
            p = self.params[slot]
            draft = drafts[row]
            events.append(StepEvent(slot, 0, step, p.max_denoising_steps, tuple(draft), tuple(self.piece(t) for t in draft),
                                    tuple(entropies[row]), tuple(accepted[row]), means[row], p.confidence_threshold,
                                    converged[row]))
            if converged[row]:
                events.append(RequestEvent(slot, "done", text=self.text(draft), token_ids=tuple(draft), canvases=1,
                                           steps=step, seed=p.seed, prompt=self.prompts[slot],
                                           extra={"logprobs": logprobs(slot)}))
        return events

    def failed(self, slots: Sequence[int], sentence: str) -> list[Event]:
        """The requests a run left open (it ran out of memory): each ends with the run's one sentence."""
        return [RequestEvent(slot, "error", error=sentence, seed=self.params[slot].seed, prompt=self.prompts[slot])
                for slot in slots]
