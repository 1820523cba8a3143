"""Plotly figures drawn from the board (pure: board or plans in, spec out): confidence per step, tiles
against free memory, the explorer's plan. Built as plain Plotly JSON specs, not through
`plotly.graph_objects`, whose validation of 32 traces would take the CPU the engine needs at every
frame; `plotly.graph_objects.Figure(spec)` accepts every spec here (the tests check that)."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

from gradio.data_classes import GradioModel

from dgemma.events import TilePlan
from dgemma.memory.ledger import TERMS, Ledger
from dgemma.ui.board import Board
from dgemma.units import GiB, MiB

# Free memory (GiB) and a small model's peak transient (KiB) differ by 10^6: a log axis shows both.
MEMORY_FLOOR_MIB = 1e-3
# Entropy can be exactly 0 for a certain canvas; a log axis needs a floor to draw it.
ENTROPY_FLOOR = 1e-6
# Ten distinguishable colours (Plotly's default cycle), reused when there are more requests.
COLORS = ("#636efa", "#ef553b", "#00cc96", "#ab63fa", "#ffa15a", "#19d3f3", "#ff6692", "#b6e880", "#ff97ff", "#fecb52")
_AXIS = dict(gridcolor="#ececec", zerolinecolor="#d0d0d0", linecolor="#bbb", showline=True)

Spec = dict[str, Any]


# The ledger's terms bottom to top (TERMS): the reserve and the weights browns, the samplers' state blues, the caches purple.
LEDGER_COLORS = ("rgba(121,85,72,0.6)", "rgba(188,170,164,0.6)", "rgba(144,202,249,0.6)", "rgba(30,136,229,0.6)",
                 "rgba(171,71,188,0.6)")
CHART_HEIGHT = 330  # px: two charts stacked beside the board fit a 768 px high projector screen


def _layout(title: str, **extra: Any) -> dict:
    # The legend below the x-axis title: above the plot, a wrapped legend of five or more entries covers the title.
    # uirevision: keep the user's zoom across live updates.
    return dict(title=dict(text=title, font=dict(size=14)), height=CHART_HEIGHT, margin=dict(l=60, r=60, t=40, b=110),
                paper_bgcolor="white", plot_bgcolor="white",
                legend=dict(orientation="h", yanchor="top", y=-0.45, x=0, font=dict(size=10)), uirevision="keep", **extra)


def entropy_figure(board: Board) -> Spec:
    """Mean entropy per request per denoising step, log y, with the confidence threshold. A colour's
    lines are one trace (None between them; a legend up to one request a colour): 32 requests redraw as 10 lines."""
    traces: dict[int, dict] = {}
    for i, view in enumerate(board.requests.values()):
        trace = traces.setdefault(i % len(COLORS), dict(
            type="scatter", mode="lines", name=f"#{view.index}", showlegend=len(board.requests) <= len(COLORS), x=[], y=[], text=[],
            hovertemplate="%{text}: %{y:.3g} after step %{x}<extra></extra>", line=dict(width=1.2, color=COLORS[i % len(COLORS)])))
        points = ([(None, None)] if trace["x"] and view.entropy_curve else []) + [  # None: a gap between two lines
            (x, max(ENTROPY_FLOOR, y)) for x, y in view.entropy_curve]
        trace["x"] += [x for x, _ in points]
        trace["y"] += [y for _, y in points]
        trace["text"] += [f"#{view.index}"] * len(points)
    data = [trace for trace in traces.values() if trace["x"]]
    shapes, annotations = [], []
    logs = [math.log10(y) for trace in data for y in trace["y"] if y is not None]  # the axis's range, in decades
    if board.confidence_threshold is not None:
        y = board.confidence_threshold if board.confidence_threshold > 0 else ENTROPY_FLOOR
        logs.append(math.log10(y))
        shapes.append(dict(type="line", xref="paper", x0=0, x1=1, yref="y", y0=y, y1=y,
                           line=dict(color="crimson", dash="dash", width=1.5)))
        annotations.append(dict(xref="paper", x=1, yref="y", y=math.log10(y), yanchor="bottom",
                                xanchor="right", showarrow=False, font=dict(color="crimson", size=11),
                                text=f"confidence threshold {board.confidence_threshold:g}"))
    # Not Plotly's: at step 0 only the threshold is drawn, one value, one long label. 2+ decades, room above for the label.
    low, high = (min(logs), max(logs)) if logs else (0.0, 0.0)
    return {"data": data, "layout": _layout(
        "Mean entropy per request per step", shapes=shapes, annotations=annotations,
        xaxis=dict(title=dict(text="denoising steps taken (all canvases)"), **_AXIS),
        yaxis=dict(title=dict(text="mean entropy (nats)"), type="log", range=[low - 0.25, max(high, low + 2) + 0.5],
                   exponentformat="power", automargin=True, **_AXIS))}


def tile_figure(plans: Sequence[TilePlan], first_call: int = 1) -> Spec:
    """One point per sampler call: requests per tile and tiles (left), memory in MiB (right).

    `first_call` numbers the first plan shown (the board keeps only the latest calls).
    """
    calls = list(range(first_call, first_call + len(plans)))
    # Lines, not bars or markers: one SVG path per trace however many calls there are, so a
    # live redraw stays cheap for the browser (bars and markers cost one element per point).
    step = dict(shape="hv")
    # Without a tracker (a plain host, for speed) the sampler reports its calibrated estimate.
    measured = all(getattr(p, "peak_measured", True) for p in plans)
    data: list[dict] = [
        dict(type="scatter", mode="lines", x=calls, y=[p.num_decode for p in plans], name="requests denoising",
             fill="tozeroy", fillcolor="rgba(120,120,120,0.18)", line=dict(color="rgba(120,120,120,0.5)", **step)),
        dict(type="scatter", mode="lines", x=calls, y=[max(p.tiles, default=0) for p in plans],
             name="tile size (largest tile run)", line=dict(color="#1f77b4", width=2.5, **step)),
        dict(type="scatter", mode="lines", x=calls, y=[len(p.tiles) for p in plans], name="tiles per call",
             line=dict(color="#ff7f0e", width=2, dash="dot", **step)),
    ]
    # Under a budget, each call's whole memory ledger (dgemma/memory/ledger.py) stacked up to it, as PyTorch's
    # memory visualizer stacks categories: what the engine held, the call's peak, then what was left free.
    ledgers = [Ledger.of_call(p.budget_bytes, p.held, p.peak_transient_bytes, 1, p.num_decode) for p in plans]
    stacked = bool(plans) and all(p.budget_bytes and p.held for p in plans)
    memory = [(name, [getattr(c, key) for c in ledgers], color) for (key, name), color in zip(TERMS, LEDGER_COLORS)
              if stacked and any(getattr(c, key) for c in ledgers)]
    memory += [(f"peak transient (MiB{'' if measured else ', calibrated estimate'})", [p.peak_transient_bytes for p in plans],
                "#d62728"), ("free memory (MiB)", [c.left for c in ledgers] if stacked else [p.free_bytes for p in plans], "#2ca02c")]
    data += [dict(type="scatter", mode="lines", x=calls, y=[_mib(v) for v in values], yaxis="y2", name=name,
                  **(dict(stackgroup="ledger", fillcolor=color, line=dict(color=color, width=0.5, **step)) if stacked
                     else dict(line=dict(color=color))))
             for name, values, color in memory]  # fmt: skip
    if any(p.budget_bytes for p in plans):
        data.append(dict(type="scatter", mode="lines", x=calls, y=[_mib(p.budget_bytes or 0) for p in plans],
                         yaxis="y2", name="budget (MiB)", line=dict(color="black", dash="dash")))
    splits = [(c, len(p.splits)) for c, p in zip(calls, plans, strict=True) if p.splits]
    # Memory on a log axis when free memory and transients are decades apart (a small model on a big host).
    positive = [v for p in plans for v in (p.free_bytes, p.peak_transient_bytes) if v > 0]
    log = not stacked and bool(positive) and max(positive) / min(positive) > 100
    if splits:
        data.append(dict(type="scatter", mode="markers", x=[c for c, _ in splits], y=[n for _, n in splits],
                         name="OOM split and retried", marker=dict(symbol="x", color="black", size=10)))
    return {"data": data, "layout": _layout(
        "How each sampler call was tiled against free memory", xaxis=dict(title=dict(text="sampler call"), **_AXIS),
        yaxis=dict(title=dict(text="requests"), rangemode="tozero", **_AXIS),
        yaxis2=dict(title=dict(text="MiB (log)" if log else "MiB"), overlaying="y", side="right", showgrid=False,
                    **(dict(type="log") if log else dict(rangemode="tozero"))))}


def _mib(nbytes: int) -> float:
    return max(MEMORY_FLOOR_MIB, round(nbytes / MiB, 4))


def board_tile_figure(board: Board) -> Spec:
    return tile_figure(board.plans, first_call=board.plan_count - len(board.plans) + 1)


def mark_step(spec: Spec, x: float, x_range: tuple[float, float], text: str, now: bool = False) -> Spec:
    """`spec` with a dotted vertical line at `x` (the step a replay shows) and its x axis fixed to
    `x_range` (the whole run), so the axis stays put while the slider moves; `now` also marks where
    every line ends (each request's point at this step)."""
    layout = spec["layout"]
    layout["shapes"] = [*layout.get("shapes", []), dict(
        type="line", xref="x", x0=x, x1=x, yref="paper", y0=0, y1=1, line=dict(color="#555", width=1.5, dash="dot"))]
    layout["annotations"] = [*layout.get("annotations", []), dict(
        xref="x", x=x, yref="paper", y=1, yanchor="bottom", showarrow=False, text=text, font=dict(size=11, color="#555"))]
    layout["xaxis"] = {**layout["xaxis"], "range": list(x_range), "autorange": False}
    if now:
        ends = [(t["x"][i], t["y"][i]) for t in spec["data"] if t.get("mode") == "lines"  # each line's, None after it
                for i in range(len(t["x"])) if t["x"][i] is not None and t["x"][i + 1:i + 2] in ([], [None])]
        spec["data"].append(dict(type="scatter", mode="markers", name="at this step", showlegend=False,
                                 x=[e[0] for e in ends], y=[e[1] for e in ends],
                                 marker=dict(color="#333", size=6)))
    return spec


def plot(spec: Spec) -> GradioModel:
    """A spec as gr.Plot's value, serialised once (the fast path past plotly.graph_objects)."""
    from gradio.components.plot import PlotData

    return PlotData(type="plotly", plot=json.dumps(spec))


# The explorer's four ways of running one sampler call (dgemma/plan.py), one colour each.
PLAN_SERIES = (
    ("untiled_peak_bytes", "untiled (one tile)", "#d62728"),
    ("seed_peak_bytes", "seed heuristic (×10 guess)", "#ff7f0e"),
    ("tiled_peak_bytes", "calibrated tiling", "#1f77b4"),
    ("chunked_peak_bytes", "chunked step", "#2ca02c"),
)


def plan_figure(rows: Sequence[dict]) -> Spec:
    """Sampler peak (GiB, log) against requests for one GPU's plan rows, free memory as a line,
    and the first request count where the untiled step needs more than is free marked."""
    requests = [r["requests"] for r in rows]
    data: list[dict] = [
        dict(type="scatter", mode="lines+markers", x=requests, name=name, line=dict(color=color, width=2),
             y=[None if r[key] is None else r[key] / GiB for r in rows])
        for key, name, color in PLAN_SERIES
    ]  # fmt: skip
    free = rows[0]["free_bytes"] if rows else 0
    annotations = []
    if free > 0:
        for y, name, dash in ((free, "free memory", "dash"), (free / 2, "half of free (the planner's share)", "dot")):
            data.append(dict(type="scatter", mode="lines", x=[requests[0], requests[-1]], y=[y / GiB] * 2,
                             name=f"{name}: {y / GiB:.1f} GiB", line=dict(color="black", dash=dash, width=1.5)))
        oom = next((r for r in rows if not r["fits_untiled"]), None)
        if oom is not None:
            data.append(dict(type="scatter", mode="markers", x=[oom["requests"]], y=[oom["untiled_peak_bytes"] / GiB],
                             name="untiled runs out of memory", marker=dict(symbol="x", size=14, color="black")))
            annotations.append(dict(x=math.log10(oom["requests"]), y=math.log10(oom["untiled_peak_bytes"] / GiB),
                                    text=f"untiled OOM at {oom['requests']}", showarrow=True, arrowhead=2, ax=-50, ay=-30))
    elif rows:
        annotations.append(dict(xref="paper", yref="paper", x=0.02, y=0.98, xanchor="left", showarrow=False,
                                font=dict(color="crimson", size=12),
                                text=f"the weights ({rows[0]['weights_bytes'] / GiB:.1f} GiB) do not fit: nothing runs"))
    title = f"Sampler peak vs requests on {rows[0]['gpu']}, canvas {rows[0]['canvas_length']}" if rows else "Sampler peak"
    return {"data": data, "layout": _layout(
        title, annotations=annotations,
        xaxis=dict(title=dict(text="concurrent requests"), type="log", tickvals=requests, ticktext=[str(n) for n in requests], **_AXIS),
        yaxis=dict(title=dict(text="peak transient of one sampler call (GiB, log)"), type="log", **_AXIS))}  # fmt: skip
