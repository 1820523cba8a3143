"""Example prompts that fit the loaded checkpoint.

The embedded model only knows its task families (dgemma/embedded/corpus.py: lowercase letters,
digits and " .+:,"), so it gets those prompts. A checkpoint with a chat template (the released
instruction-tuned model) gets short chat questions; any other checkpoint gets plain openings.
A prompt outside the teaching model's families gets a note (`dgemma/embedded/scope.py` owns the grammar).
"""

from __future__ import annotations

from dgemma.embedded import scope

TASK_PROMPTS = [
    "add 12+34", "reverse hello", "count 5 to 12", "story: big cat, park",
    "sort 3 1 4 1 5", "repeat ab 4", "add 57+68", "story: red fox, river",
]  # fmt: skip
CHAT_PROMPTS = [
    "Why is the sky blue?", "Write a haiku about autumn rain.", "What is a diffusion language model?",
    "Give three tips for learning to cook.", "Explain recursion to a ten-year-old.",
    "Name five animals that live in the Arctic.", "What is the capital of Australia?", "Suggest a name for a cat.",
]  # fmt: skip
# The lesson's batch, cycled: one canvas a request (its memory is the point), so each answer fits one canvas of
# the embedded model (16 tokens, its end of text included): a class reads whole, right answers.
LESSON_PROMPTS = ("add 12+34", "reverse hello", "count 5 to 9", "sort 3 1 4 1 5")
PLAIN_PROMPTS = [
    "The sky is blue because", "Once upon a time, in a small village,", "The three primary colours are",
    "A recipe for pancakes:", "The first law of thermodynamics states", "Here is a short poem about the sea:",
    "The capital of Australia is", "My favourite animal is",
]  # fmt: skip


def example_prompts(info: dict) -> list[str]:
    """One prompt per entry, chosen from the model's facts (`LoadedModel.facts()`)."""
    if info.get("embedded"):
        return list(TASK_PROMPTS)
    return list(CHAT_PROMPTS if info.get("chat_template") else PLAIN_PROMPTS)


def lesson_prompts(requests: int) -> list[str]:
    """The lesson's batch of `requests` prompts (prompt i has seed S + i)."""
    return [LESSON_PROMPTS[i % len(LESSON_PROMPTS)] for i in range(requests)]


def example_sets(prompts: list[str], per_set: int = 4) -> list[list[str]]:
    """gr.Examples rows for the prompts box: `per_set` prompts, one per line, in each."""
    return [["\n".join(prompts[i : i + per_set])] for i in range(0, len(prompts), per_set)]


def prompt_note(embedded: bool, prompt: str) -> str:
    """The note a card, the API's `warning` and the CLI show for a prompt outside the teaching
    model's task families; "" for any other model (only the teaching model's scope is known)."""
    return scope.note(prompt) if embedded else ""


def abilities(info: dict) -> str:
    """A few words for the page header on what the served model can do ("" for a real checkpoint)."""
    return f"The teaching model knows {scope.SUMMARY}; other prompts give noise." if info.get("embedded") else ""
