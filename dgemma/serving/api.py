"""The API endpoints: `generate` (prompts and settings in, texts and tile plans out) and `info`, listed
on the app's API page (gr.api derives the schema from the type hints). Settings use the CLI's names
and meanings, so one call gives the same tokens through the API, the CLI and the UI. Bad input is a
gr.Error with one sentence, and no traceback in the log (a visitor's mistake is not the server's failure)."""

from __future__ import annotations

import os
from dataclasses import asdict

import gradio as gr

from dgemma.errors import SettingsError
from dgemma.examples import example_prompts, prompt_note
from dgemma.recording import MODEL_KEYS
from dgemma.serving.runs import RunService, tab_of
from dgemma.settings import CANVAS_NAMES, SETTINGS, api_help


def model_info(facts: dict, max_num_seqs: int) -> dict:
    """What `/info` returns and the page header shows, from a backend's `info()`: the model's
    facts, the batch limit and example prompts that fit it."""
    return {**{key: facts.get(key) for key in MODEL_KEYS}, "max_num_seqs": max_num_seqs, "examples": example_prompts(facts)}


def register(service: RunService, embedded: bool = False) -> None:
    """Add the endpoints to the Blocks being built (call inside `with gr.Blocks()`); `service`: the runs of
    the page's backend, whose caps a call counts against; `embedded`: the served model is the teaching
    model, whose outputs carry a `warning` for prompts outside its families."""
    backend = service.backend

    def generate_endpoint(prompts: list[str], settings: dict | None = None, request: gr.Request = None) -> dict:
        """Generate one text per prompt. settings (optional; dgemma/settings.py's table): {settings}.
        start and pins are one value for every prompt or a list aligned with the prompts; record
        (true: also return the run as the page's "Download run" file).
        Returns {"outputs": [{"prompt", "text", "steps", "seed", "warning", "metrics"}...],
        "summary": the run's figures, "tile_plans": [...], "recording": the file's text (JSON lines;
        only with record)}; "warning" is "" unless the teaching model was asked something outside
        its task families; "metrics" and "summary" quote tokens_per_s, tokens_per_forward
        (transformers' definition), steps_per_canvas, decoder_share, sampler_share and
        peak_sampler_bytes (dgemma/metrics.py)."""
        try:
            record = None
            if isinstance(settings, dict):  # `record` is not a sampling setting: whether to return the run file
                settings = dict(settings)
                record = settings.pop("record", None)
            if record is not None and not isinstance(record, bool):
                raise SettingsError(f"Setting 'record' must be true or false, got {str(record)[:40]!r}.")
            done = service.results(tab_of(request), prompts, settings, bool(record))
        except gr.Error:  # already one sentence (ZeroGPU's quota)
            raise
        except ValueError as err:  # SettingsError is one; the tab's cap; no room for the recording
            raise gr.Error(str(err), print_exception=False) from None
        failed = [o for o in done.outputs if o.error]
        if failed:
            # An expected event (out of memory, a cancel): the engine logged anything unexpected already.
            raise gr.Error(f"Prompt {done.outputs.index(failed[0]) + 1} failed: {failed[0].error}", print_exception=False)
        result = {
            "outputs": [{"prompt": o.prompt, "text": o.text, "steps": o.steps, "seed": o.seed,
                         "warning": prompt_note(embedded, o.prompt), "metrics": o.metrics} for o in done.outputs],
            "summary": done.summary,
            "tile_plans": [asdict(p) for p in done.plans],
            "pid": done.pid or os.getpid(),  # the process that ran the model (ZeroGPU: a worker)
        }
        if done.recording is not None:
            result["recording"] = done.recording
        return result

    generate_endpoint.__doc__ = generate_endpoint.__doc__.replace("{settings}", api_help())  # the one table's names and help
    gr.api(generate_endpoint, api_name="generate", concurrency_limit=None)

    def info() -> dict:
        """The served model: {"model" (name or path), "embedded" (this project's teaching model or not),
        "parameters", "dtype", "device", "vocab_size", "canvas_length", "max_num_seqs", "examples"
        (prompts that fit it), "defaults" (every setting a call may give, by name, as this server fills it in:
        the scheduler and its options among them)}."""
        defaults = {s.name: backend.defaults.value(s.name) for s in SETTINGS if s.name not in CANVAS_NAMES}
        return {**model_info(backend.info(), backend.max_num_seqs), "defaults": defaults}

    gr.api(info, api_name="info", concurrency_limit=None)
