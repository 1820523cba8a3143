"""The page's title block, and page first: until the model has loaded, a timer refreshes the status
line; at ready it redraws the title block, enables Run and sends the model's defaults and example
prompts as one `fill`; and every page served from then on is built ready (`settle`: no timer, no tick).
A page opened while loading may be typed in as its tick brings the values: so the tick writes no field
itself, and the browser, as the fill arrives, writes each value only into a field the visitor has not
touched (by its elem_id, kept in a page-wide set: Gradio may redraw the input element) and that still
shows what the page was built with."""

from __future__ import annotations

import html
from collections.abc import Mapping

import gradio as gr

from dgemma.examples import abilities, example_prompts, example_sets
from dgemma.serving.api import model_info
from dgemma.serving.backend import Backend, backend_state
from dgemma.ui import asset
from dgemma.ui.generate_tab.controls import PANEL_SETTINGS, page_value
from dgemma.ui.generate_tab.tab import GenerateTab

MARK_TOUCHED_JS, FILL_JS = asset("mark_touched.js"), asset("fill_untouched.js")


def _count(n: int | None) -> str:
    if not n:
        return "?"
    for size, unit in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return str(n)


def header_markdown(facts: dict, max_num_seqs: int) -> str:
    """The page's title block from a backend's `info()`: what the app is, and the facts `/info` returns."""
    info = model_info(facts, max_num_seqs)
    path = html.escape(str(info.get("model") or "?"))
    name = "the embedded teaching model" if info.get("embedded") else path.rstrip("/").rsplit("/", 1)[-1]
    vocab = info.get("vocab_size")
    line = (f'<span title="{path}">Model: <b>{name}</b></span> · {_count(info.get("parameters"))} parameters · '
            f'{info.get("dtype")} on {info.get("device")} · vocab {vocab:,} · canvas {info.get("canvas_length")} tokens · '
            f"up to {info.get('max_num_seqs')} requests at once · memory budget {facts.get('memory_budget', 'none')}"
            if isinstance(vocab, int) else f"Model: {name} (loading …)")
    for extra in (facts.get("note"), abilities(facts)):  # what one click means on ZeroGPU; what the model knows
        line += f"<br>{extra}" if extra else ""
    return ("# dgemma · watch a Diffusion-Gemma sampler at work\n"
            "Many prompts denoise at once: every card is one request's canvas turning from random "
            f"tokens into text. The sampler tiles its work so it fits in memory. <small>{line}</small>")


def loading_tick(backend: Backend, replaying: bool, ids: Mapping[str, str], built: Mapping[str, object]) -> dict:
    """What changes, by name (`wire` keys it by component). While loading: the status line. At ready: the model's header, Run enabled, the values for the
    settings fields and the prompts box (`fill`: the browser writes the untouched ones), the example
    prompts, and the timer off (the status line says "Idle." unless a replay holds it).

    By field name (the panel's settings, "lesson_budget", "prompts"): `ids` their DOM ids, `built` their values as built."""
    state = backend_state(backend)
    if not state.ready:  # still loading, or failed: only the status line changes
        return {"status": state.message, "timer": gr.Timer(active=not state.failed)}
    facts = backend.info()  # once: it counts the weights and sizes the lesson's budget
    sets = example_sets(example_prompts(facts))
    defaults = {s.name: page_value(s, backend.defaults) for s in PANEL_SETTINGS}  # the panel's, by name
    values = {**defaults, "lesson_budget": facts.get("lesson_budget", built.get("lesson_budget")), "prompts": sets[0][0]}
    fill = {"values": values, "ids": dict(ids), "built": dict(built)}
    shown = {"header": header_markdown(facts, backend.max_num_seqs), "run": gr.Button(interactive=True), "fill": fill,
             "examples": gr.Dataset(samples=sets), "timer": gr.Timer(active=False)}
    return shown if replaying else {**shown, "status": "Idle."}


def dom_id(component: gr.components.Component) -> str:
    """The id of a component's element on the page: its elem_id (without one it has none)."""
    if not component.elem_id:
        raise ValueError(f"a field the loading tick fills needs an elem_id: {component.label or repr(component)}")
    return component.elem_id


def wire(demo: gr.Blocks, backend: Backend, ready: bool, header: gr.Markdown, tab: GenerateTab,
         fields: Mapping[str, gr.components.Component]) -> None:
    """The timer and its fill: the Generate tab's status line, Run and example prompts; `fields` (by name) the
    settings, the lesson's budget and the prompts box, filled at ready where untouched."""
    built = {name: field.value for name, field in fields.items()}
    ids = {name: dom_id(field) for name, field in fields.items()}
    fill = gr.JSON(None, visible=False)
    timer = gr.Timer(0.5, active=not ready)
    demo.load(None, js=MARK_TOUCHED_JS)
    outputs = dict(header=header, status=tab.status, run=tab.run, fill=fill, examples=tab.examples.dataset, timer=timer)
    timer.tick(lambda played: {outputs[k]: v for k, v in loading_tick(backend, played.recording is not None, ids, built).items()},
               [tab.player.state], list(outputs.values()), show_progress="hidden", api_visibility="private",
               concurrency_limit=None,
               ).then(None, [fill, *fields.values()], [*fields.values()], js=FILL_JS, show_progress="hidden", api_visibility="private")

    def settle() -> None:  # the components take the ready tick's values; Gradio makes anew the config every page gets
        tick = loading_tick(backend, False, ids, built)
        shown = ((header, tick["header"]), (tab.status, tick["status"]), *((f, tick["fill"]["values"][n]) for n, f in fields.items()))
        for component, value in shown:
            component.value = component.postprocess(value)
        tab.run.interactive, timer.active = True, False
        tab.examples.dataset.samples = tab.examples.dataset.raw_samples = tick["examples"].raw_samples  # text as shown
        demo.config = demo.get_config_file()
    if not ready:  # a page-first backend (serving/loading.py): it calls this when the model answers
        backend.on_ready = settle
