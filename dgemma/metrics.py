"""The numbers people quote about a diffusion run, per request and per run, one definition each.

- tokens_per_s: output tokens per second (a request: from admission to its end; a run: wall time);
- tokens_per_forward: transformers' definition (`DiffusionGemmaForBlockDiffusion.generate`'s
  `tokens_per_forward`): the tokens of the committed canvases up to and including EOS, pad tokens
  excluded, per decoder forward pass (one per denoising step the request took);
- steps_per_canvas: denoising steps per committed canvas;
- predictor_steps: the scheduler's own steps among the forwards (DDIM's corrector sweeps are
  forwards too, not steps of its schedule); scheduler: which one ran (a run: each one its requests used);
- decoder_share / sampler_share: of the time of the steps the request took part in, the share in
  the decoder's forward and in the sampler step (shared steps: a batch's decoder call is one call);
- peak_sampler_bytes: the largest transient the sampler step allocated in those steps.

Plain numbers in, plain dicts out (no torch): the engine, the CLI, the API, the recording and the
page all quote the same figures.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from dgemma.units import format_bytes

@dataclass(frozen=True)
class Work:
    """What a request (or a whole run) did and spent."""

    tokens: int  # output tokens (the text's)
    canvas_tokens: int  # committed canvases' tokens as transformers counts them (up to EOS, no pad)
    steps: int  # denoising steps = decoder forward passes
    canvases: int  # committed canvases
    seconds: float
    decoder_seconds: float
    sampler_seconds: float
    peak_sampler_bytes: int
    predictor_steps: int  # the scheduler's steps among `steps` (fewer by DDIM's corrector sweeps)
    scheduler: str  # sampling/schedulers/'s SCHEDULERS; a run's: its requests' names, joined by " + "


def _ratio(a: float, b: float, digits: int = 4) -> float | None:
    return round(a / b, digits) if b > 0 else None


def figures(work: Work) -> dict:
    """The quoted figures of `work` (None where a denominator is zero)."""
    busy = work.decoder_seconds + work.sampler_seconds
    return dict(
        scheduler=work.scheduler, tokens=work.tokens, canvas_tokens=work.canvas_tokens, seconds=round(work.seconds, 4),
        tokens_per_s=_ratio(work.tokens, work.seconds, 2),
        tokens_per_forward=_ratio(work.canvas_tokens, work.steps),
        decoder_forwards=work.steps, predictor_steps=work.predictor_steps, canvases=work.canvases,
        steps_per_canvas=_ratio(work.steps, work.canvases, 2),
        decoder_seconds=round(work.decoder_seconds, 4), sampler_seconds=round(work.sampler_seconds, 4),
        decoder_share=_ratio(work.decoder_seconds, busy), sampler_share=_ratio(work.sampler_seconds, busy),
        peak_sampler_bytes=int(work.peak_sampler_bytes),
    )  # fmt: skip


def run_summary(requests: Sequence[dict | None], wall_seconds: float) -> dict:
    """A run's figures from its requests' (`figures` dicts, as their final events carry them; None
    for one that never ran) and the run's wall time. Tokens per forward is the run's tokens over its
    requests' forwards (transformers' per-row figure, summed over rows); the decoder and sampler
    shares weigh each request's steps alike (a step shared by n requests counts n times)."""
    done = [r for r in requests if r]
    work = Work(
        tokens=sum(r["tokens"] for r in done), canvas_tokens=sum(r["canvas_tokens"] for r in done),
        steps=sum(r["decoder_forwards"] for r in done),
        canvases=sum(r["canvases"] for r in done), seconds=wall_seconds,
        decoder_seconds=sum(r["decoder_seconds"] for r in done), sampler_seconds=sum(r["sampler_seconds"] for r in done),
        peak_sampler_bytes=max((r["peak_sampler_bytes"] for r in done), default=0),
        predictor_steps=sum(r.get("predictor_steps", r["decoder_forwards"]) for r in done),
        scheduler=" + ".join(dict.fromkeys(r.get("scheduler", "") for r in done if r.get("scheduler"))),
    )  # fmt: skip
    summary = figures(work)
    del summary["decoder_seconds"], summary["sampler_seconds"]  # summed over requests: not the run's time
    return {**summary, "requests": len(done)}


def shown(value: float | None, spec: str) -> str:
    """A figure as people read it: "-" when there is none, a size in its unit (`spec` "bytes")."""
    if value is None:
        return "-"
    return format_bytes(value) if spec == "bytes" else format(value, spec)


def summary_line(summary: dict) -> str:
    """The run summary as one line of text (the CLI's stderr, the page's status)."""
    def show(key: str, fmt: str) -> str:
        return shown(summary.get(key), fmt)

    sweeps = (summary.get("decoder_forwards") or 0) - (summary.get("predictor_steps") or 0)
    named = f"{summary['scheduler']} · " if summary.get("scheduler") else ""
    corrector = f" · {sweeps} of {summary['decoder_forwards']} forwards corrector sweeps" if sweeps > 0 else ""
    return (f"{named}{show('tokens_per_s', '.1f')} tokens/s · {show('tokens_per_forward', '.2f')} tokens per forward · "
            f"{show('steps_per_canvas', '.1f')} steps per canvas{corrector} · decoder {show('decoder_share', '.0%')} / "
            f"sampler {show('sampler_share', '.0%')} of a step · peak sampler memory "
            f"{shown(summary.get('peak_sampler_bytes') or 0, 'bytes')}")
