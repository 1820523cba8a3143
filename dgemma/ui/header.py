"""The page's title block: what the app is, and the facts of the model being served."""

from __future__ import annotations

import html

from dgemma.examples import abilities
from dgemma.serving.api import model_info


def _count(n: int | None) -> str:
    if not n:
        return "?"
    for size, unit in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return str(n)


def header_facts(info: dict, memory_budget: str) -> str:
    """The facts line under the title: the same facts `/info` returns."""
    path = html.escape(str(info.get("model") or "?"))
    name = "the embedded teaching model" if info.get("embedded") else path.rstrip("/").rsplit("/", 1)[-1]
    vocab = info.get("vocab_size")
    return (
        f'<span title="{path}">Model: <b>{name}</b></span> · {_count(info.get("parameters"))} parameters · '
        f'{info.get("dtype")} on {info.get("device")} · vocab {vocab:,} · canvas {info.get("canvas_length")} tokens · '
        f"up to {info.get('max_num_seqs')} requests at once · memory budget {memory_budget}"
        if isinstance(vocab, int) else f"Model: {name} (loading …)"
    )


def header_markdown(facts: dict, max_num_seqs: int) -> str:
    """The page's title block from a backend's `info()`."""
    note = f"<br>{facts['note']}" if facts.get("note") else ""  # e.g. what one click means on ZeroGPU
    knows = abilities(facts)
    note += f"<br>{knows}" if knows else ""
    return (
        "# dgemma · watch a Diffusion-Gemma sampler at work\n"
        "Many prompts denoise at once: every card is one request's canvas turning from random "
        "tokens into text. The sampler tiles its work so it fits in memory. "
        f"<small>{header_facts(model_info(facts, max_num_seqs), facts.get('memory_budget', 'none'))}{note}</small>"
    )
