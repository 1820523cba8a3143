"""The Generate tab's inputs by setting name (the panel made from dgemma/settings.py's `SETTINGS`) and
how their values become a run's settings. Handlers take them as one dict (the panel: each name of FIELDS
to its component, Gradio's `inputs_kwargs`), so a new setting is a row of the table and nothing here."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gradio as gr

from dgemma.serving.backend import Backend
from dgemma.settings import SETTINGS, Setting, Settings
from dgemma.ui.generate_tab.first_canvas import canvas_settings

PANEL_ROWS = ("length", "sampling", "scheduler", "layout")  # the panel's rows, top to bottom: the table's groups
PANEL_SETTINGS = tuple(s for s in SETTINGS if s.group in PANEL_ROWS)
# The Run endpoint's inputs, in order: what a gradio_client caller passes positionally (`client_inputs`).
FIELDS = ("prompts", "concurrent", *(s.name for s in SETTINGS), "template")


def page_value(setting: Setting, settings: Settings) -> Any:
    """What the page's field for `setting` shows for `settings` (a memory budget: empty, the server's)."""
    if setting.name == "memory_budget":
        return ""
    value = settings.value(setting.name)
    return str(value) if setting.widget == "choice" else value


def read_panel(values: Mapping[str, Any]) -> tuple[list[str], dict[str, Any]]:
    """The panel's prompts and raw settings, from its values by name, as `Backend.request` takes them
    (ValueError: one sentence, from a template the page cannot read)."""
    raw = {s.name: values[s.name] for s in PANEL_SETTINGS}
    raw = {name: (v.strip() or None) if isinstance(v, str) else v for name, v in raw.items()}  # empty text: the default
    raw.update(canvas_settings(values["start"], values["pins"], values["template"]))
    return prompts_from_text(values["prompts"], values["concurrent"]), raw


def client_inputs(prompts: str, concurrent: int, **values: Any) -> list[Any]:
    """The Run endpoint's inputs in FIELDS order for a gradio_client caller: the page's defaults
    (those of `Settings()`), changed by `values` (by setting name)."""
    unknown = set(values) - set(FIELDS)
    if unknown:
        raise ValueError(f"no such field: {sorted(unknown)}")
    shown = {s.name: page_value(s, Settings()) for s in PANEL_SETTINGS}
    shown.update(start="", pins="", template="", prompts=prompts, concurrent=concurrent, **values)
    return [shown[name] for name in FIELDS]


def widget(setting: Setting, value: Any, **extra: Any) -> gr.components.Component:
    """The page's field for one setting of the table (its elem_id: setting-NAME)."""
    common = dict(label=setting.label, elem_id=f"setting-{setting.name}", **extra)
    if setting.widget == "checkbox":
        return gr.Checkbox(value, info=setting.help, **common)
    if setting.widget == "choice":
        return gr.Dropdown(list(setting.choices), value=value, allow_custom_value=setting.custom, info=setting.help,
                           **common)
    if setting.widget in ("integer", "number"):
        return gr.Number(value, precision=0 if setting.widget == "integer" else None, info=setting.help, **common)
    return gr.Textbox(value, info=setting.help, **common)


def settings_panel(backend: Backend) -> dict[str, gr.components.Component]:
    """The settings accordion, filled with the model's defaults: the table's panel settings by name."""
    fields: dict[str, gr.components.Component] = {}
    budget = f"the server's: {backend.info().get('memory_budget', 'none')}"
    with gr.Accordion("Settings (the model's defaults)", open=False):
        for row in PANEL_ROWS:
            with gr.Row():
                for s in (s for s in PANEL_SETTINGS if s.group == row):
                    extra = {"placeholder": budget} if s.name == "memory_budget" else {}
                    fields[s.name] = widget(s, page_value(s, backend.defaults), **extra)
    return fields


def prompts_from_text(text: str, concurrent: int) -> list[str]:
    """The UI's textbox: one prompt per non-empty line, cycled to fill `concurrent` requests."""
    lines = [line for line in (text or "").splitlines() if line.strip()]
    if not lines:
        return []
    n = max(len(lines), int(concurrent or 0))
    return [lines[i % len(lines)] for i in range(n)]
