"""Page first, on the page: until the model has loaded, a timer refreshes the status line; at ready
it shows the model's header, enables Run, fills in the model's own defaults and example prompts,
and stops."""

from __future__ import annotations

from collections.abc import Sequence

import gradio as gr

from dgemma.examples import example_sets
from dgemma.serving.api import model_info
from dgemma.serving.backend import Backend, backend_state
from dgemma.ui.generate.controls import model_defaults_of
from dgemma.ui.header import header_markdown

UNCHANGED_OUTPUTS = 13  # header … example prompts: what a tick leaves alone while the model loads


def loading_tick(backend: Backend, shown_prompts: str, first_examples: str, replaying: bool = False,
                 shown: Sequence = (), built: Sequence = ()) -> list:
    """While loading: the status line. At ready: the model's header, defaults and example prompts,
    Run enabled, and the timer off (the status line says "Idle." unless a replay holds it).

    `shown` are the settings fields' values on the page and `built` the values the page was built
    with: a field the visitor has already changed keeps its value (every fresh page gets one tick,
    0.5 s after it opens, even when the model was ready long before)."""
    state = backend_state(backend)
    if not state.ready:  # still loading, or failed: only the status line changes
        return [gr.skip(), state.message, *[gr.skip()] * UNCHANGED_OUTPUTS, gr.Timer(active=not state.failed)]
    facts = backend.info()  # once: it counts the weights and sizes the lesson's budget
    sets = example_sets(model_info(facts, backend.max_num_seqs)["examples"])
    prompts = sets[0][0] if shown_prompts == first_examples else gr.skip()  # keep what the user typed
    idle = gr.skip() if replaying else "Idle."
    settings = [*model_defaults_of(backend), facts.get("lesson_budget", gr.skip())]
    if shown and built:
        settings = [value if now == then else gr.skip() for value, now, then in zip(settings, shown, built, strict=True)]
    return [header_markdown(facts, backend.max_num_seqs), idle, gr.Button(interactive=True), *settings, prompts,
            gr.Dataset(samples=sets), gr.Timer(active=False)]
