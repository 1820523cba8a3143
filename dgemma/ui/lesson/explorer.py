"""The lesson's what-if explorer: `python -m dgemma.plan` for one GPU, the released or the loaded model
and a canvas length, drawn (charts.plan_figure), tabled and read in its sentence. dgemma.plan
(calibrated on meta tensors) is imported when first used: the page's modules stay torch-free."""

from __future__ import annotations

import html
from collections.abc import Sequence

import gradio as gr

from dgemma.ui.charts import plan_figure, plot
from dgemma.units import format_bytes

CANVAS_CHOICES = [("the model's own", 0), 16, 32, 64, 128, 256, 512, 1024]
DEFAULT_GPU = "h200"
# A scheduler's costliest kind of row, which the calibrated tiling is planned for (`calibration.COSTLIEST`).
SCHEDULER_ROWS = [("entropy bound, or any scheduler at temperature 0", "sample"),
                  ("block refinement or DDIM at a temperature", "tempered"),
                  ("DDIM with corrector sweeps (float64 over the vocabulary)", "sweep")]
INTRO = (
    "### What if: the sampler on real GPUs\n"
    "No GPU needed: the weights are the checkpoint's size in bf16, free memory is the GPU's capacity "
    "minus a 2 GiB runtime reserve, the weights and the engine's sampler state (the memory ledger's terms), and every "
    "step's peak is calibrated on meta tensors "
    "(`python -m dgemma.plan` prints the same rows for every GPU). *Untiled*: the seed's eager step as one "
    "tile. *Seed heuristic*: the same step in groups of `max(1, min(n, 0.5 × free // (CL × vocab × 4 × 10)))`. "
    "*Calibrated tiling*: this project's planner over its reference step. *Chunked*: the step that streams the vocabulary. "
    "*ZeroGPU large / xlarge*: the two workload sizes a ZeroGPU Space can ask for, half and all of an RTX Pro 6000 "
    "(the bytes the `spaces` package states); the app asks for the smaller one that holds the model."
)


def plan_table(rows: Sequence[dict]) -> str:
    """The rows as a small HTML table: requests, then each way's layout and peak."""
    head = "".join(f"<th>{h}</th>" for h in ("requests", "untiled", "seed heuristic", "calibrated tiling", "chunked"))
    body = []
    for r in rows:
        untiled = format_bytes(r["untiled_peak_bytes"]) + ("" if r["fits_untiled"] else " (OOM)")
        seed = f"{r['seed_tiles']} × {r['seed_group']}: {format_bytes(r['seed_peak_bytes'])}" + ("" if r["fits_seed"] else " (OOM)")
        tiled = "—" if r["tile_size"] is None else f"{r['tiles']} × {r['tile_size']}: {format_bytes(r['tiled_peak_bytes'])}"
        chunked = "—" if r["chunked_peak_bytes"] is None else (
            f"{r['chunked_tiles']} × {r['chunked_tile_size']}: {format_bytes(r['chunked_peak_bytes'])}")  # fmt: skip
        cells = (r["requests"], untiled, seed, tiled, chunked)
        body.append("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in cells) + "</tr>")
    return (f'<table class="plan-table"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>'
            "<small>tiles × requests per tile: peak transient of one sampler call</small>")  # fmt: skip


def explore(backend, gpu_key: str, which: str, canvas_length: int, row: str = "sample") -> dict:
    """The sentence, the chart and the table, by name (`section` keys them by component), for one GPU, the released or the loaded model, a canvas length and the
    scheduler's kind of row the calibrated tiling is planned for."""
    from dgemma import plan

    # A choice that cannot be drawn is one sentence where the explorer's sentence goes (no error
    # badge over the chart); the last chart and table stay.
    gpu = next((g for g in plan.GPUS if g.key == gpu_key), None)
    if gpu is None:
        return {"sentence": f"Unknown GPU {gpu_key!r}: choose one from the list."}
    model, name = plan.RELEASED, "the released model"
    if which == "loaded":
        facts = backend.info()
        if not isinstance(facts.get("vocab_size"), int):
            return {"sentence": "The model is still loading; choose the released model or try again in a moment."}
        model = plan.model_from_facts(facts)
        name = "the embedded model" if facts.get("embedded") else f"the loaded model ({model.name})"
    rows = plan.plan_rows(model, (gpu,), plan.REQUESTS, int(canvas_length or 0) or None, row=row or "sample")
    return {"sentence": plan.plan_sentence(rows, name), "chart": plot(plan_figure(rows)), "table": plan_table(rows)}


def section(backend) -> None:
    """The explorer's components and events (call inside the lesson's tab)."""
    from dgemma.gpus import GPUS, RELEASED_ID

    facts = backend.info()
    models = [(f"released: {RELEASED_ID} (26 B, bf16)", "released")]
    if facts.get("model"):  # its public name, never a path
        models.append((f"loaded: {'the embedded model' if facts.get('embedded') else facts['model']}", "loaded"))
    with gr.Column(elem_id="explorer"):
        gr.Markdown(INTRO)
        with gr.Row():
            gpu = gr.Dropdown([(g.label, g.key) for g in GPUS], value=DEFAULT_GPU, label="GPU", elem_id="explorer-gpu")
            model = gr.Radio(models, value="released", label="model", elem_id="explorer-model")
            canvas = gr.Dropdown(CANVAS_CHOICES, value=0, label="canvas length", elem_id="explorer-canvas")
            scheduler = gr.Dropdown(SCHEDULER_ROWS, value="sample", label="scheduler (calibrated tiling)",
                                    elem_id="explorer-scheduler")
        sentence = gr.Markdown("", elem_id="explorer-sentence")
        chart = gr.Plot(label="sampler peak vs requests", elem_id="explorer-plot")
        table = gr.HTML("", elem_id="explorer-table")
    shown = dict(sentence=sentence, chart=chart, table=table)
    gr.on(None, lambda g, m, c, r: {shown[k]: v for k, v in explore(backend, g, m, c, r).items()},
          [gpu, model, canvas, scheduler], list(shown.values()), api_visibility="private")  # fmt: skip
