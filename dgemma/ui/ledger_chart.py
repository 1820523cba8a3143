"""The memory ledger drawn, call by call, as PyTorch's memory visualizer stacks categories: one bar per
sampler call, what the engine held bottom to top (dgemma/memory/ledger.py's terms), the call's tile
peak, then what was left free, against the budget. A call whose tile did not fit crosses the line,
labelled in the words of torch.OutOfMemoryError. Pure: ledgers in, a Plotly spec out."""

from __future__ import annotations

from collections.abc import Sequence

from dgemma.memory.ledger import TERMS, Ledger
from dgemma.ui.charts import _AXIS, LEDGER_COLORS, Spec, _layout
from dgemma.units import GiB, MiB, format_bytes

# The tile orange (red when it did not fit), free a pale green, above the ledger's terms (LEDGER_COLORS).
TILE, OVER, FREE = "#ff9800", "#d62728", "rgba(46,125,50,0.25)"


def ledger_figure(calls: Sequence[Ledger], title: str, mark: int | None = None, oom_last: bool = False) -> Spec:
    """Stacked bars for `calls` (call 1 first); `mark`: the call a step-through shows (outlined);
    `oom_last`: the last call's tile is what it tried to allocate and did not get."""
    unit, name = (GiB, "GiB") if max((c.needed for c in calls), default=0) >= 4 * GiB else (MiB, "MiB")
    x = list(range(1, len(calls) + 1))
    data = [dict(type="bar", x=x, y=[getattr(c, key) / unit for c in calls], name=label, marker=dict(color=color), width=0.6)
            for (key, label), color in zip(TERMS, LEDGER_COLORS) if any(getattr(c, key) for c in calls)]
    tile_colors = [OVER if oom_last and i == len(calls) - 1 else TILE for i in range(len(calls))]
    data.append(dict(type="bar", x=x, y=[c.tile / unit for c in calls], name="this call's tile peak", width=0.6,
                     marker=dict(color=tile_colors, line=dict(color=["#000" if k == mark else tile_colors[i]
                                                                     for i, k in enumerate(x)], width=2))))
    budgets = [c.budget for c in calls if c.budget]
    if budgets:
        data.append(dict(type="bar", x=x, y=[c.left / unit for c in calls], name="free",
                         marker=dict(color=FREE), width=0.6))
        data.append(dict(type="scatter", mode="lines", x=[0.5, len(calls) + 0.5], y=[budgets[0] / unit] * 2,
                         name=f"budget {format_bytes(budgets[0])}", line=dict(color="black", dash="dash", width=2)))
    annotations = []
    if oom_last and calls:
        last = calls[-1]
        annotations.append(dict(x=len(calls), y=last.needed / unit, yanchor="bottom", showarrow=False,
                                font=dict(color=OVER, size=12), text=f"Tried to allocate {format_bytes(last.tile)}; "
                                f"{format_bytes(last.free or 0)} is free"))
    layout = _layout(title, barmode="stack", bargap=0.25, annotations=annotations,
                     xaxis=dict(title=dict(text="sampler call"), dtick=1 if len(calls) <= 20 else None, **_AXIS),
                     yaxis=dict(title=dict(text=name), rangemode="tozero", **_AXIS))
    layout["legend"]["y"] = -0.55  # below the axis title: two rows of five or six terms
    return {"data": data, "layout": layout}

