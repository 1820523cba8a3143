"""The page, top to bottom: the title, the Generate tab, the Compare tab, the Tiling-vs-OOM tab, and the API. It only
composes: each tab builds and wires its own components, and all work goes through the Backend."""

from __future__ import annotations

import gradio as gr

from dgemma.examples import example_prompts, example_sets
from dgemma.serving import api
from dgemma.serving.backend import Backend, backend_state
from dgemma.serving.runs import Keeping, RunService, tab_of
from dgemma.ui.generate_tab import compare, tab as generate_tab
from dgemma.ui.generate_tab.controls import PANEL_SETTINGS
from dgemma.ui.lesson import tab as lesson
from dgemma.ui import loading_tick
from dgemma.ui.loading_tick import header_markdown


def build_demo(backend: Backend, keeping: Keeping | None = None) -> gr.Blocks:
    """The whole app for one backend (one engine, one model); `keeping`: the directory and caps for
    visitors' run files and the cap on runs held in memory (app.py's; by default a directory of its own)."""
    service = RunService(backend, keeping)
    keeping = service.keeping
    loading = backend_state(backend)
    facts = backend.info()
    examples = example_sets(example_prompts(facts))

    with gr.Blocks(title="dgemma: watch diffusion canvases denoise", delete_cache=keeping.files.delete_cache()) as demo:
        header = gr.Markdown(header_markdown(facts, backend.max_num_seqs))
        with gr.Tab("Generate", elem_id="generate"):
            gen = generate_tab.build(backend, examples, loading.ready, loading.message)
        with gr.Tab("Compare", elem_id="compare"):
            side_by_side = compare.build()
        with gr.Tab("Tiling vs OOM"):
            lesson_parts = lesson.build(backend)

        # ---------------------------------------------------------------- events
        embedded = bool(facts.get("embedded"))  # the teaching model: prompts outside its families get a note
        generate_tab.wire(service, gen, side_by_side, embedded)
        lesson.wire(service, lesson_parts)
        api.register(service, embedded)
        # Page first: until the model has loaded, a timer refreshes the status line; at ready it
        # enables Run and fills in the model's own defaults and example prompts where the visitor has not typed.
        fields = {**{s.name: gen.panel[s.name] for s in PANEL_SETTINGS}, "lesson_budget": lesson_parts.budget,
                  "prompts": gen.panel["prompts"]}
        loading_tick.wire(demo, backend, loading.ready, header, gen, fields)

        def closed(request: gr.Request) -> None:
            service.closed(tab_of(request))  # its runs stop, its files go, its runs leave memory

        demo.unload(closed)
    return demo
