"""From a sampler step to events: one host transfer, detokenizing, event building, delivery.

Events go to the request's handle and to every mailbox subscribed to its subscriber key (or to
all); tile plans go to the mailboxes whose subscriber's requests took part in the step.
"""

from __future__ import annotations

import math
import threading
from array import array
from dataclasses import dataclass

import torch

from dgemma.engine.mailbox import Mailbox
from dgemma.engine.requests import Request
from dgemma.events import Event, RequestEvent, Status, StepEvent, TilePlan
from dgemma.sampling import StepOutput


@dataclass
class HostStep:
    """A sampler step's outputs on the host, one entry per row: what the frames and the convergence
    decisions read."""

    draft: list[list[int]]
    entropy: list[list[float]]
    accepted: list[list[bool]]
    mean_entropy: list[float]
    converged: list[bool]
    finite: list[bool]  # False where a request's logits held NaN/inf


def to_host(out: StepOutput) -> HostStep:
    """The step's outputs as Python lists in ONE device->host copy (one sync per step on CUDA).
    Token ids are exact in float64."""
    n, cl = out.draft.shape
    packed = torch.cat([out.draft.double(), out.entropy.double(), out.accepted.double(),
                        torch.stack([out.mean_entropy.double(), out.converged.double(), out.finite.double()], dim=1)],
                       dim=1).cpu()
    draft = packed[:, :cl].long().tolist()
    entropy = packed[:, cl : 2 * cl].float().tolist()
    accepted = packed[:, 2 * cl : 3 * cl].bool().tolist()
    mean, converged, finite = packed[:, 3 * cl :].unbind(1)
    return HostStep(draft, entropy, accepted, mean.float().tolist(), converged.bool().tolist(), finite.bool().tolist())


class Detokenizer:
    """Token ids to text, safe from any thread (fast tokenizers are not), single pieces cached."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.lock = threading.Lock()
        self._pieces: dict[int, str] = {}

    def piece(self, token: int) -> str:
        piece = self._pieces.get(token)
        if piece is None:
            with self.lock:
                piece = self._pieces[token] = self.tokenizer.decode([token])
        return piece

    def text(self, tokens: list[int]) -> str:
        with self.lock:
            return self.tokenizer.decode(tokens, skip_special_tokens=True)


def step_event(req: Request, step: int, draft: list[int], entropy: list[float], accepted: list[bool],
               mean_entropy: float, converged: bool, detok: Detokenizer) -> StepEvent:
    params = req.params
    return StepEvent(request_id=req.id, canvas_index=req.canvas_index, step=step, max_steps=params.max_denoising_steps,
                     token_ids=tuple(draft), pieces=tuple(detok.piece(t) for t in draft), entropy=tuple(entropy),
                     accepted=tuple(accepted), mean_entropy=mean_entropy,
                     confidence_threshold=params.confidence_threshold, converged=converged)


def start_event(req: Request, canvas: list[int], vocab_size: int, detok: Detokenizer) -> StepEvent:
    """Step 0: the canvas as it starts, uniform random tokens. Its entropy is the uniform
    distribution's, log(vocab) at every position (rounded to float32 as every step's is), and no
    position is accepted yet."""
    uniform = array("f", [math.log(vocab_size)])[0]
    return step_event(req, 0, canvas, [uniform] * len(canvas), [False] * len(canvas), uniform, False, detok)


def request_event(req: Request, status: str, detok: Detokenizer | None = None, error: str = "",
                  extra: dict | None = None) -> RequestEvent:
    """A RequestEvent with the request's committed text so far (none without `detok`); `steps` counts
    decoder forwards, extra's `predictor_steps` the scheduler's steps (fewer by DDIM's corrector sweeps)."""
    return RequestEvent(
        req.id, Status(status), text=detok.text(req.tokens) if detok is not None else "", token_ids=tuple(req.tokens),
        canvases=req.canvas_index, steps=req.steps, error=error, seed=req.params.seed, prompt=req.prompt,
        extra={"predictor_steps": req.predictor_steps, **(extra or {})},
    )


class Subscribers:
    """Mailboxes subscribed to all events or to one subscriber's; thread-safe."""

    def __init__(self):
        self._lock = threading.Lock()
        self._boxes: list[tuple[Mailbox, str | None, bool]] = []  # mailbox, subscriber, wants tile plans

    def add(self, subscriber: str | None, tile_plans: bool, coalesce: bool) -> Mailbox:
        mailbox = Mailbox(coalesce=coalesce)
        with self._lock:
            self._boxes.append((mailbox, subscriber, tile_plans))
        return mailbox

    def remove(self, mailbox: Mailbox) -> None:
        with self._lock:
            self._boxes = [b for b in self._boxes if b[0] is not mailbox]
        mailbox.close()

    def close_all(self) -> None:
        with self._lock:
            boxes = list(self._boxes)
        for mailbox, _, _ in boxes:
            mailbox.close()

    def emit(self, req: Request, event: Event) -> None:
        req.handle.deliver(event)
        with self._lock:
            boxes = list(self._boxes)
        for mailbox, subscriber, _ in boxes:
            if subscriber is None or subscriber == req.subscriber:
                mailbox.put(event)

    def emit_plan(self, plan: TilePlan | None, rows: list[Request]) -> None:
        if plan is None:
            return
        with self._lock:
            boxes = list(self._boxes)
        taking_part = {r.subscriber for r in rows}
        for mailbox, subscriber, wants in boxes:
            if wants and (subscriber is None or subscriber in taking_part):
                mailbox.put(plan)
