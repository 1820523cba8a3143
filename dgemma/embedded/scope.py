"""What the teaching model knows: the prompt grammar of its task families, and the note for the rest.

The model was trained only on the prompts `corpus.py` generates, so a prompt of any other shape
("what is 2+2?", "Hello, who are you?", even "add 7+5", one-digit) gets characters that look
like an answer but are not. `note(prompt)` says so in one sentence, naming the families, for a
card, the API's `warning` and the CLI's stderr; a prompt the grammar accepts gets "". The
patterns follow the generators in `corpus.py` (tests/test_corpus.py checks every held-out
prompt of every family is accepted). Pure Python: the page imports it before torch has loaded.
"""

from __future__ import annotations

import re

from dgemma.embedded.corpus import ADJECTIVES, NOUNS, PLACES

# What the header says the teaching model can do, in a few words.
SUMMARY = ("counting (count 5 to 12), two-digit addition (add 12+34), reversing a word, sorting digits, "
           "repeating a pattern (repeat ab 4) and tiny stories (story: big cat, park)")
NOTE = (f"The teaching model only knows its task families -- {SUMMARY} -- so expect noise for this prompt; "
        "try one of the example prompts.")


def _words(options: tuple[str, ...]) -> str:
    return "(?:" + "|".join(options) + ")"


_FAMILIES = {
    "count": re.compile(r"count (\d{1,2}) to (\d{1,2})"),
    "add": re.compile(r"add [1-9]\d\+[1-9]\d"),
    "reverse": re.compile(r"reverse [a-z]{3,8}"),
    "sort": re.compile(r"sort \d(?: \d){3,6}"),
    "repeat": re.compile(r"repeat [a-z]{1,3} [2-9]"),
    "prose": re.compile(rf"story: {_words(ADJECTIVES)} {_words(NOUNS)}, {_words(PLACES)}"),
}


def family(prompt: str) -> str | None:
    """The task family whose grammar accepts `prompt` (surrounding spaces ignored), or None."""
    text = prompt.strip()
    for name, pattern in _FAMILIES.items():
        match = pattern.fullmatch(text)
        if match and (name != "count" or 3 <= int(match[2]) - int(match[1]) + 1 <= 12):
            return name
    return None


def note(prompt: str) -> str:
    """One sentence for a prompt outside every family; "" for one the model was trained on."""
    return "" if family(prompt) else NOTE
