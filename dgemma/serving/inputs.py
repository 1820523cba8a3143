"""A call's prompts and limits, checked; settings parsed under those limits (one sentence per mistake)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dgemma.errors import SettingsError
from dgemma.settings import Settings, parse_settings


@dataclass(frozen=True)
class Limits:
    """What one call or one tab may ask for, so that one client cannot starve the others."""

    max_prompts: int = 64  # prompts in one call (after filling up to `concurrent`)
    max_new_tokens: int = 256
    max_queued: int = 64  # requests one tab (a browser tab, an API client) may have waiting or running at once
    max_prompt_chars: int = 4000


def parse_call_settings(raw: Any, defaults: Settings, limits: Limits, max_num_seqs: int, prompts: int = 1) -> Settings:
    """`parse_settings` under this server's limits: max_new_tokens, a tile of at most max_num_seqs."""
    return parse_settings(raw, defaults, max_new_tokens=limits.max_new_tokens, max_tile=max_num_seqs, prompts=prompts)


def parse_prompts(prompts: Any, limits: Limits) -> list[str]:
    """Prompts as given (order kept); one sentence when the list is empty, too long or malformed."""
    if isinstance(prompts, str):
        prompts = [prompts]
    if not isinstance(prompts, (list, tuple)):
        raise SettingsError(f"Prompts must be a list of strings, got {type(prompts).__name__}.")
    if not prompts:
        raise SettingsError("Give at least one prompt.")
    if len(prompts) > limits.max_prompts:
        raise SettingsError(f"Too many prompts: {len(prompts)} given, at most {limits.max_prompts} per call.")
    out = []
    for i, prompt in enumerate(prompts):
        if not isinstance(prompt, str):
            raise SettingsError(f"Prompt {i + 1} must be a string, got {type(prompt).__name__}.")
        if not prompt.strip():
            raise SettingsError(f"Prompt {i + 1} is empty; write some text or remove it.")
        if len(prompt) > limits.max_prompt_chars:
            raise SettingsError(f"Prompt {i + 1} is {len(prompt)} characters long; the limit is {limits.max_prompt_chars}.")
        # Lone surrogates cannot be encoded or tokenized; say so instead of failing deep inside.
        try:
            prompt.encode("utf-8")
        except UnicodeEncodeError:
            raise SettingsError(f"Prompt {i + 1} holds characters that are not valid Unicode text.") from None
        out.append(prompt)
    return out


def prompts_from_text(text: str, concurrent: int) -> list[str]:
    """The UI's textbox: one prompt per non-empty line, cycled to fill `concurrent` requests."""
    lines = [line for line in (text or "").splitlines() if line.strip()]
    if not lines:
        return []
    n = max(len(lines), int(concurrent or 0))
    return [lines[i % len(lines)] for i in range(n)]
