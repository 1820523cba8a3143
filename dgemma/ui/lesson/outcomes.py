"""The lesson's result boxes: a run's outcome read from its events by `summarize` (its plans, each
call's requests, the tokens committed, the out-of-memory figures its requests' final events carry),
and the boxes drawn from outcomes (pure)."""

from __future__ import annotations

import html
from collections.abc import Iterable
from dataclasses import dataclass, field

from dgemma.errors import sentence
from dgemma.events import Event, RequestEvent, Status, StepEvent, TilePlan
from dgemma.memory.ledger import Ledger
from dgemma.units import format_bytes

UNTILED, TILED, CHUNKED = "Untiled (one tile)", "Tiled (auto)", "Chunked sampler, untiled (one tile)"
PENDING = '<div class="lesson-result">running…</div>'
COMPARING = '<div class="lesson-result">comparing tokens with an untiled rerun that has room…</div>'


@dataclass
class LessonOutcome:
    """One of the lesson's runs: finished, or out of memory with the numbers."""

    ok: bool
    message: str  # one sentence: what happened, with the numbers
    needed_bytes: int = 0  # the calibrated peak of the tile that ran out of memory
    free_bytes: int = 0  # free before that sampler call
    plans: list[TilePlan] = field(default_factory=list)
    tokens: dict[int, tuple[int, ...]] = field(default_factory=dict)  # request index (0-based) -> committed ids
    seconds: float = 0.0
    detail: str = ""  # the allocator's own line, for the curious
    # The requests (0-based) of every sampler call in order, the one that ran out of memory last
    # (it has no plan): tile j of call k held calls[k][sum(tiles[:j]) : sum(tiles[:j + 1])].
    calls: list[tuple[int, ...]] = field(default_factory=list)
    budget: int | None = None  # the run's memory budget (None: none)
    held: dict[str, int] = field(default_factory=dict)  # what the engine held when the tile ran out, by ledger term

    def ledgers(self) -> list[Ledger]:
        """Each call's memory ledger in order; the one that ran out of memory last, its tile what it tried to allocate."""
        calls = [Ledger.of_call(p.budget_bytes, p.held, p.peak_transient_bytes, max(p.tiles, default=0), p.num_decode)
                 for p in self.plans]
        n = len(self.calls[-1]) if self.calls else 0
        return calls + ([Ledger.of_call(self.budget, self.held, self.needed_bytes, n, n)] if self.needed_bytes else [])


def summarize(events: Iterable[Event], seconds: float, budget: int | None) -> LessonOutcome:
    """A run's outcome from its events in order, under `budget` (None: none). A call's
    step frames follow its plan, in the call's row order; the requests a tile left out of memory end
    with an error whose `extra["oom"]` holds the tile's figures."""
    index: dict[int, int] = {}
    plans: list[TilePlan] = []
    calls: list[list[int]] = []
    tokens: dict[int, tuple[int, ...]] = {}
    errors: list[str] = []
    oom: dict | None = None
    for e in events:
        if isinstance(e, TilePlan):
            plans.append(e)
            calls.append([])
            continue
        i = index.setdefault(e.request_id, len(index))
        if isinstance(e, StepEvent):
            if e.step and calls:
                calls[-1].append(i)
        elif isinstance(e, RequestEvent) and e.status == Status.DONE:
            tokens[i] = tuple(e.token_ids)
        elif isinstance(e, RequestEvent) and e.status in (Status.ERROR, Status.CANCELLED):
            errors.append(e.error or e.status)
            if "oom" in e.extra:
                if oom is None:
                    oom = e.extra["oom"] or {}
                    calls.append([])
                calls[-1].append(i)
    common = dict(plans=plans, tokens=tokens, seconds=seconds, calls=[tuple(c) for c in calls], budget=budget)
    if errors:
        oom = oom or {}
        return LessonOutcome(False, sentence(errors[0]),
                             needed_bytes=oom.get("needed_bytes", 0), free_bytes=oom.get("free_bytes", 0),
                             detail=oom.get("detail", ""), held=oom.get("held", {}), **common)
    vocab = f", vocab {plans[0].vocab_size:,}" if plans else ""
    where = f"budget {format_bytes(budget)}" if budget else "no budget"
    return LessonOutcome(True, f"{len(tokens)} requests denoised one canvas each ({where}{vocab}).", **common)

def box(kind: str, outcome: str, head: str, body: str = "") -> str:
    """One result box: `kind` its class (ok, oom, same, or none), `outcome` its data-outcome (or none),
    `head` and `body` HTML (escaped by the caller)."""
    data = f' data-outcome="{outcome}"' if outcome else ""
    return f'<div class="lesson-result{" " + kind if kind else ""}"{data}>{head}{body}</div>'


def render_outcome(outcome: LessonOutcome | None, title: str) -> str:
    """One run's result box: the OOM with its numbers, or the tiles it ran."""
    name = html.escape(title)
    if outcome is None:
        return box("", "", f"<b>{name}</b>: not run yet.")
    if outcome.ok:
        peak = max((p.peak_transient_bytes for p in outcome.plans), default=0)
        return box("ok", "ok", f"<b>{name}: completed.</b> ", f"{html.escape(outcome.message)} {len(outcome.plans)} "
                   f"sampler calls, up to {max((len(p.tiles) for p in outcome.plans), default=0)} tiles per call, "
                   f"peak transient {format_bytes(peak)}, {outcome.seconds:.1f} s.")
    numbers = (f" Needed {format_bytes(outcome.needed_bytes)} for one tile of all requests, free {format_bytes(outcome.free_bytes)}. "
               "Tiling runs them a few at a time, each tile within half of what is free: the same tokens, a lower peak."
               if outcome.needed_bytes or outcome.free_bytes else "")
    detail = f"<br><small>allocator: {html.escape(outcome.detail)}</small>" if outcome.detail else ""
    return box("oom", "oom", f"<b>{name}: out of memory.</b> ", f"{html.escape(outcome.message)}{numbers}{detail}")


def render_chunked(outcome: LessonOutcome | None) -> str:
    """The third run's box; without real scale it explains why it was not run."""
    if outcome is not None:
        return render_outcome(outcome, CHUNKED)
    return box("", "skipped", f"<b>{html.escape(CHUNKED)}</b>: runs with <i>real scale</i> on. ",
               "The chunked step streams the vocabulary and keeps per-position running sums and a [CL, hidden] "
               "soft-embedding accumulator; at this model's tiny vocabulary those outweigh the logits themselves, "
               "so chunking only pays at real vocabularies.")


def render_verdict(tiled: LessonOutcome, reference: LessonOutcome, chunked: LessonOutcome | None = None) -> str:
    """Whether the tiled (and chunked) runs' tokens equal the untiled reference's, request by request."""
    if not (tiled.ok and reference.ok):
        return render_not_compared(tiled.message if not tiled.ok else reference.message, "")
    same = [i for i in tiled.tokens if reference.tokens.get(i) == tiled.tokens[i]]
    n = len(tiled.tokens)
    if len(same) != n or n != len(reference.tokens):
        differ = sorted(set(tiled.tokens) - set(same))
        return box("oom", "different", f"<b>Tokens differ</b> for requests {', '.join(map(str, differ[:10]))}: ",
                   f"{len(same)} of {n} identical.")
    note = ""
    if chunked is not None and chunked.ok:  # did the chunked step, untiled, commit the reference step's tokens?
        agree = sum(reference.tokens.get(i) == t for i, t in chunked.tokens.items())
        note = (f" The chunked step, untiled under the same budget, committed the same token ids for {agree} of "
                f"{len(chunked.tokens)} requests.")
    return box("same", "identical", "<b>Identical tokens.</b> ", f"All {n} requests committed the same token ids "
               "tiled as untiled (the untiled rerun had a budget large enough for a single tile)." + note)


def render_not_compared(sentence: str, outcome: str = "error") -> str:
    return box("oom", outcome, "Tokens not compared: ", html.escape(sentence))


def render_failure(title: str, sentence: str) -> str:
    """A run that could not happen: its card says why, in one sentence."""
    return box("oom", "error", f"<b>{html.escape(title)}: not run.</b> ", html.escape(sentence))
