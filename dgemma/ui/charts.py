"""Plotly figures drawn from the board (pure: board or plans in, figure out).

Two charts: the mean entropy of every request at every denoising step (log scale, with the
confidence threshold below which a canvas counts as confident), and how each sampler call was
tiled against free memory (tile size, tiles per call, free memory, measured peak transient,
and the budget).
"""

from __future__ import annotations

from collections.abc import Sequence

import plotly.graph_objects as go

from dgemma.events import TilePlan
from dgemma.ui.board import Board

MiB = 1024**2
# Entropy can be exactly 0 for a certain canvas; a log axis needs a floor to draw it.
ENTROPY_FLOOR = 1e-6

_LAYOUT = dict(
    template="plotly_white",
    height=340,
    margin=dict(l=60, r=60, t=48, b=44),
    legend=dict(orientation="h", yanchor="bottom", y=1.02, x=0, font=dict(size=10)),
    uirevision="keep",  # keep the user's zoom across live updates
)


def entropy_figure(board: Board) -> go.Figure:
    """Mean entropy per request per denoising step, log y, with the confidence threshold."""
    fig = go.Figure()
    for view in board.requests.values():
        if not view.entropy_curve:
            continue
        xs, ys = zip(*view.entropy_curve, strict=True)
        fig.add_trace(
            go.Scatter(
                x=list(xs),
                y=[max(ENTROPY_FLOOR, y) for y in ys],
                mode="lines",
                line=dict(width=1.2),
                name=f"#{view.request_id}",
                showlegend=len(board.requests) <= 12,
            )
        )
    if board.confidence_threshold is not None:
        fig.add_hline(
            y=max(ENTROPY_FLOOR, board.confidence_threshold),
            line=dict(color="crimson", dash="dash"),
            annotation_text=f"confidence threshold {board.confidence_threshold:g}",
            annotation_position="top right",
        )
    fig.update_layout(
        title=dict(text="Mean entropy per request per step", font=dict(size=14)),
        xaxis_title="denoising steps taken (all canvases)",
        yaxis_title="mean entropy (nats)",
        yaxis_type="log",
        **_LAYOUT,
    )
    return fig


def tile_figure(plans: Sequence[TilePlan], first_call: int = 1) -> go.Figure:
    """One point per sampler call: requests per tile and tiles (left), memory in MiB (right).

    `first_call` numbers the first plan shown (the board keeps only the latest calls).
    """
    calls = list(range(first_call, first_call + len(plans)))
    fig = go.Figure()
    fig.add_trace(go.Bar(x=calls, y=[p.num_decode for p in plans], name="requests denoising",
                         marker_color="rgba(120,120,120,0.25)"))
    fig.add_trace(go.Scatter(x=calls, y=[max(p.tiles, default=0) for p in plans], mode="lines+markers",
                             name="tile size (largest tile run)", line=dict(color="#1f77b4", width=2)))
    fig.add_trace(go.Scatter(x=calls, y=[len(p.tiles) for p in plans], mode="markers",
                             name="tiles per call", marker=dict(symbol="diamond", color="#ff7f0e", size=7)))
    fig.add_trace(go.Scatter(x=calls, y=[p.free_bytes / MiB for p in plans], mode="lines", yaxis="y2",
                             name="free memory (MiB)", line=dict(color="#2ca02c")))
    fig.add_trace(go.Scatter(x=calls, y=[p.peak_transient_bytes / MiB for p in plans], mode="lines", yaxis="y2",
                             name="peak transient (MiB)", line=dict(color="#d62728")))
    budgets = [p.budget_bytes for p in plans if p.budget_bytes]
    if budgets:
        fig.add_trace(go.Scatter(x=calls, y=[(p.budget_bytes or 0) / MiB for p in plans], mode="lines",
                                 yaxis="y2", name="budget (MiB)", line=dict(color="black", dash="dot")))
    splits = [(c, len(p.splits)) for c, p in zip(calls, plans, strict=True) if p.splits]
    if splits:
        fig.add_trace(go.Scatter(x=[c for c, _ in splits], y=[n for _, n in splits], mode="markers",
                                 name="OOM split and retried", marker=dict(symbol="x", color="black", size=10)))
    fig.update_layout(
        title=dict(text="How each sampler call was tiled against free memory", font=dict(size=14)),
        xaxis_title="sampler call",
        yaxis=dict(title="requests", rangemode="tozero"),
        yaxis2=dict(title="MiB", overlaying="y", side="right", rangemode="tozero", showgrid=False),
        barmode="overlay",
        **_LAYOUT,
    )
    return fig


def board_tile_figure(board: Board) -> go.Figure:
    return tile_figure(board.plans, first_call=board.plan_count - len(board.plans) + 1)
