"""The API endpoints: `generate` (prompts and settings in, texts and tile plans out) and `info`.

Listed on the app's API page (gr.api derives its schema from the type hints). Settings use the
CLI's names and meanings (`seed` S gives the i-th prompt the seed S + i), so one call gives the
same tokens through the API, the CLI and the UI. Bad input is a gr.Error with one sentence, and no
traceback in the server's log (a visitor's mistake is not the server's failure).
"""

from __future__ import annotations

import dataclasses
import os
import time

import gradio as gr

from dgemma.errors import SettingsError
from dgemma.metrics import run_summary
from dgemma.examples import example_prompts, prompt_note
from dgemma.serving.held_runs import DEFAULT_MAX_BYTES, HeldRuns, Reserved, recording_bound
from dgemma.recording import MODEL_KEYS, Recording, run_header
from dgemma.serving.backend import Backend
from dgemma.serving.inputs import parse_call_settings, parse_prompts
from dgemma.serving.sessions import Sessions
from dgemma.settings import api_help

INFO_KEYS = MODEL_KEYS  # what /info returns and what a run file's header keeps of the model
NO_ROOM = ("The server's memory for recorded runs is full right now; try again in a minute, or call without "
           "'record'.")


def model_info(facts: dict, max_num_seqs: int) -> dict:
    """What `/info` returns and the page header shows, from a backend's `info()`: the model's
    facts, the batch limit and example prompts that fit it."""
    info = {key: facts.get(key) for key in INFO_KEYS}
    info["max_num_seqs"] = max_num_seqs
    info["examples"] = example_prompts(facts)
    return info


def _record_option(settings: object) -> tuple[object, bool]:
    """`record` is not a sampling setting: the settings without it, and whether to return the run file."""
    if not isinstance(settings, dict) or "record" not in settings:
        return settings, False
    settings = dict(settings)
    record = settings.pop("record")
    if record is None:
        return settings, False
    if not isinstance(record, bool):
        raise SettingsError(f"Setting 'record' must be true or false, got {str(record)[:40]!r}.")
    return settings, record


def register(backend: Backend, sessions: Sessions, embedded: bool = False, held: HeldRuns | None = None) -> None:
    """Add the endpoints to the Blocks being built (call inside `with gr.Blocks()`); `embedded`: the
    served model is the teaching model, whose outputs carry a `warning` for prompts outside its families;
    `held`: the cap on runs held in memory, which a call with `record: true` counts against while it runs."""
    limits = backend.limits
    held = held or HeldRuns(DEFAULT_MAX_BYTES)

    def generate(prompts: list[str], settings: dict | None = None, request: gr.Request = None) -> dict:
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
            batch = parse_prompts(prompts, limits)
            settings, record = _record_option(settings)
            checked = parse_call_settings(settings, backend.defaults, limits, backend.max_num_seqs, len(batch))
        except SettingsError as err:
            raise gr.Error(str(err), print_exception=False) from None
        session = (request.session_hash if request is not None else None) or "api"
        if sessions.pending(session) + len(batch) > limits.max_queued:
            raise gr.Error(f"This session may have at most {limits.max_queued} requests waiting or running; "
                           "wait for them first.", print_exception=False)
        held_as = f"api {session} {id(batch)}"  # the recording's place under the memory cap, while the call runs
        facts = backend.info()
        most = recording_bound(len(batch), checked.max_new_tokens, checked.params.max_denoising_steps,
                               facts.get("canvas_length") or 256, facts.get("vocab_size") or 262_144)
        if record and not held.admit(held_as, Reserved(most)):
            raise gr.Error(NO_ROOM, print_exception=False)
        try:
            return call(batch, checked, record, session)
        finally:
            held.release(held_as)  # after the file's text is made: it counts while it lives

    def call(batch: list[str], checked, record: bool, session: str) -> dict:
        try:
            run = backend.start(batch, checked, stream=record)  # step frames only for a recording
        except ValueError as err:
            raise gr.Error(str(err), print_exception=False) from None
        if record:
            run.recording = Recording(run_header(backend.info(), checked, batch))
        try:
            sessions.add(session, run)
        except ValueError as err:  # a concurrent call of this client got in first
            run.close()
            raise gr.Error(str(err), print_exception=False) from None
        started = time.monotonic()
        try:
            outputs, plans = run.results()
        finally:
            run.close()
            sessions.remove(session, run)
        failed = [o for o in outputs if o.error]
        if failed:
            # An expected event (out of memory, a cancel): the engine logged anything unexpected already.
            raise gr.Error(f"Prompt {outputs.index(failed[0]) + 1} failed: {failed[0].error}", print_exception=False)
        summary = run_summary([o.metrics for o in outputs], time.monotonic() - started)
        result = {
            "outputs": [{"prompt": o.prompt, "text": o.text, "steps": o.steps, "seed": o.seed,
                         "warning": prompt_note(embedded, o.prompt), "metrics": o.metrics} for o in outputs],
            "summary": summary,
            "tile_plans": [dataclasses.asdict(p) for p in plans],
            "pid": getattr(run, "pid", None) or os.getpid(),  # the process that ran the model (ZeroGPU: a worker)
        }
        if record:
            run.recording.summary = summary
            result["recording"] = run.recording.text()
        return result

    generate.__doc__ = generate.__doc__.replace("{settings}", api_help())  # the one table's names and help
    gr.api(generate, api_name="generate", concurrency_limit=None)

    def info() -> dict:
        """The served model: {"model" (name or path), "embedded" (this project's teaching model or not),
        "parameters", "dtype", "device", "vocab_size", "canvas_length", "max_num_seqs", "examples"
        (prompts that fit it)}."""
        return model_info(backend.info(), backend.max_num_seqs)

    gr.api(info, api_name="info", concurrency_limit=None)
