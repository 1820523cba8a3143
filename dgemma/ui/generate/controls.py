"""The Generate tab's inputs: the settings accordion (filled with the model's defaults) and how
its values become the settings a run is checked against."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import gradio as gr

from dgemma.errors import SettingsError
from dgemma.serving.backend import Backend

SETTING_NAMES = (
    "max_new_tokens", "max_denoising_steps", "t_min", "t_max", "entropy_bound",
    "confidence_threshold", "stability_threshold", "seed", "greedy",
)  # fmt: skip


def tiling_setting(mode: str, fixed: float | None) -> str:
    """The tiling radio and the fixed tile size as the one `tiling` setting ("auto", "off" or N)."""
    if mode == "fixed":
        if fixed is None:
            raise SettingsError("Choose a tile size for fixed tiling.")
        return str(int(fixed)) if float(fixed).is_integer() else str(fixed)
    return mode


@dataclass
class Controls:
    """The Generate tab's inputs, in the order the run's stream takes them."""

    prompts: gr.Textbox
    concurrent: gr.Slider
    tiling: gr.Radio
    tile_size: gr.Number
    budget: gr.Textbox
    sampler: gr.Radio
    max_new_tokens: gr.Number
    max_steps: gr.Number
    t_min: gr.Number
    t_max: gr.Number
    entropy_bound: gr.Number
    confidence: gr.Number
    stability: gr.Number
    seed: gr.Number
    greedy: gr.Checkbox

    def inputs(self) -> list:
        return [getattr(self, f.name) for f in fields(self)]

    def model_defaults(self) -> list:
        """The fields the model's own defaults fill in once it has loaded, in `model_defaults_of`'s order."""
        return [self.max_new_tokens, self.max_steps, self.t_min, self.t_max, self.entropy_bound, self.confidence,
                self.stability, self.sampler]


def model_defaults_of(backend: Backend) -> list[Any]:
    """The loaded model's defaults, one per field of `Controls.model_defaults`."""
    d, p = backend.defaults, backend.defaults.params
    return [d.max_new_tokens, p.max_denoising_steps, p.t_min, p.t_max, p.entropy_bound, p.confidence_threshold,
            p.stability_threshold, d.options.sampler]


def raw_settings(values: tuple, mode: str, fixed: float | None, budget: str | None, sampler: str) -> dict[str, Any]:
    """The page's values as the settings mapping the API and the CLI use (checked by the one parser)."""
    raw = dict(zip(SETTING_NAMES, values, strict=True))
    raw["tiling"] = tiling_setting(mode, fixed)
    raw["memory_budget"] = (budget or "").strip() or None
    raw["sampler"] = sampler
    return raw


def settings_panel(backend: Backend, prompts: gr.Textbox, concurrent: gr.Slider) -> Controls:
    """The settings accordion, filled with the model's defaults."""
    defaults, limits, p = backend.defaults, backend.limits, backend.defaults.params
    with gr.Accordion("Settings (the model's defaults)", open=False):
        with gr.Row():
            max_new_tokens = gr.Number(defaults.max_new_tokens, label="max new tokens", precision=0,
                                       minimum=1, maximum=limits.max_new_tokens)
            max_steps = gr.Number(p.max_denoising_steps, label="denoising steps", precision=0)
            seed = gr.Number(p.seed, label="seed (request i gets seed + i)", precision=0)
            greedy = gr.Checkbox(p.greedy, label="greedy")
        with gr.Row():
            t_min = gr.Number(p.t_min, label="t_min")
            t_max = gr.Number(p.t_max, label="t_max")
            entropy_bound = gr.Number(p.entropy_bound, label="entropy bound")
            confidence = gr.Number(p.confidence_threshold, label="confidence threshold")
            stability = gr.Number(p.stability_threshold, label="stability threshold", precision=0)
        with gr.Row():
            tiling = gr.Radio(["auto", "off", "fixed"], value="auto", label="tiling",
                              info="auto: tiles sized from free memory; off: one tile; fixed: N requests per tile")
            tile_size = gr.Number(4, label="fixed tile size N", precision=0)
            sampler = gr.Radio(["reference", "chunked"], value=defaults.options.sampler, label="sampler step",
                               info="reference: eager, ~2 fp32 vocab copies per request (~1 on a CPU); chunked: streams the vocabulary")
            budget = gr.Textbox("", label="memory budget",
                                placeholder=f"the server's: {backend.info().get('memory_budget', 'none')}",
                                info="empty: the server's --memory-budget; e.g. 64MiB caps this run's sampler step")
    return Controls(prompts, concurrent, tiling, tile_size, budget, sampler, max_new_tokens, max_steps, t_min, t_max,
                    entropy_bound, confidence, stability, seed, greedy)
