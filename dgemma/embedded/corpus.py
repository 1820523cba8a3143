"""The embedded model's corpus: seeded task families this project generates itself.

Every family turns a `random.Random` into one (prompt, answer) pair. Checkable families have
one right answer; the prose family comes from a small grammar, so it is scored by how many
generated words belong to the grammar's lexicon instead. Nothing here is copied from elsewhere.

Held-out prompts come from `HELDOUT_SEED`; the training stream skips every held-out prompt, so
evaluation never sees a prompt the model was trained on.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import lru_cache

LETTERS = "abcdefghijklmnopqrstuvwxyz"
DIGITS = "0123456789"
# Every character a prompt or an answer may contain; the tokenizer is built from this.
ALPHABET = LETTERS + DIGITS + " .+:,"

HELDOUT_SEED = 1_000_003
HELDOUT_POOL = 100  # held-out prompts per family; eval takes the first n of them


@dataclass(frozen=True)
class Example:
    family: str
    prompt: str
    answer: str


# --- checkable families -------------------------------------------------------------------


def _count(rng: random.Random) -> tuple[str, str]:
    # Up to 12 numbers (35 characters): three canvases, so the outer loop shows.
    n = rng.randint(3, 12)
    start = rng.randint(0, 100 - n)
    numbers = range(start, start + n)
    return f"count {start} to {start + n - 1}", " ".join(map(str, numbers))


def _add(rng: random.Random) -> tuple[str, str]:
    a, b = rng.randint(10, 99), rng.randint(10, 99)
    return f"add {a}+{b}", str(a + b)


def _reverse(rng: random.Random) -> tuple[str, str]:
    word = "".join(rng.choice(LETTERS) for _ in range(rng.randint(3, 8)))
    return f"reverse {word}", word[::-1]


def _sort(rng: random.Random) -> tuple[str, str]:
    digits = [rng.choice(DIGITS) for _ in range(rng.randint(4, 7))]
    return f"sort {' '.join(digits)}", " ".join(sorted(digits))


def _repeat(rng: random.Random) -> tuple[str, str]:
    # Up to 27 characters: two canvases.
    pattern = "".join(rng.choice(LETTERS) for _ in range(rng.randint(1, 3)))
    times = rng.randint(2, 9)
    return f"repeat {pattern} {times}", pattern * times


# --- prose: a small grammar ---------------------------------------------------------------

NOUNS = ("cat", "dog", "fox", "bird", "fish", "frog", "bear", "girl", "boy", "king")
ADJECTIVES = ("big", "small", "red", "tall", "happy", "quiet", "brown", "young")
STILL_VERBS = ("sleeps", "sits", "waits", "sings", "plays", "rests")
MOVING_VERBS = ("runs", "walks", "jumps", "swims", "goes")
SEEING_VERBS = ("sees", "finds", "likes", "helps", "follows", "meets")
STILL_PREPOSITIONS = ("in", "near", "by")
PLACES = ("park", "river", "house", "hill", "garden", "tree", "lake")
FUNCTION_WORDS = ("the", "a", "it", "to")

LEXICON = frozenset(NOUNS + ADJECTIVES + STILL_VERBS + MOVING_VERBS + SEEING_VERBS + STILL_PREPOSITIONS + PLACES + FUNCTION_WORDS)


def _meets_sentence(rng: random.Random, subject: str, place: str) -> str:
    return f"{subject} {rng.choice(SEEING_VERBS)} a {rng.choice(ADJECTIVES)} {rng.choice(NOUNS)}."


def _place_sentence(rng: random.Random, subject: str, place: str) -> str:
    if rng.random() < 0.5:
        return f"{subject} {rng.choice(MOVING_VERBS)} to the {place}."
    return f"{subject} {rng.choice(STILL_VERBS)} {rng.choice(STILL_PREPOSITIONS)} the {place}."


def _prose(rng: random.Random) -> tuple[str, str]:
    # Two sentences (up to ~55 characters: four canvases). The prompt names the subject and the
    # place so there are enough distinct prompts to hold some out; verbs and objects stay free.
    noun, adjective, place = rng.choice(NOUNS), rng.choice(ADJECTIVES), rng.choice(PLACES)
    first, second = (_meets_sentence, _place_sentence) if rng.random() < 0.5 else (_place_sentence, _meets_sentence)
    answer = f"{first(rng, f'the {adjective} {noun}', place)} {second(rng, 'it', place)}"
    return f"story: {adjective} {noun}, {place}", answer


def words(text: str) -> list[str]:
    """The words of a prose answer, punctuation dropped (what lexicon_fraction counts)."""
    return text.replace(".", " ").split()


# --- the families, the held-out set, the training stream ---------------------------------

FAMILIES: dict[str, Callable[[random.Random], tuple[str, str]]] = {
    "count": _count, "add": _add, "reverse": _reverse, "sort": _sort, "repeat": _repeat, "prose": _prose,
}
CHECKABLE = tuple(name for name in FAMILIES if name != "prose")


def make_example(family: str, rng: random.Random) -> Example:
    prompt, answer = FAMILIES[family](rng)
    return Example(family, prompt, answer)


@lru_cache(maxsize=None)
def heldout(family: str, n: int = HELDOUT_POOL, seed: int = HELDOUT_SEED) -> tuple[Example, ...]:
    """The first `n` distinct prompts of `family` drawn with the held-out seed."""
    if family not in FAMILIES:
        raise ValueError(f"unknown family {family!r}; choose from {', '.join(FAMILIES)}")
    if not 1 <= n <= HELDOUT_POOL:
        raise ValueError(f"n must be in 1..{HELDOUT_POOL}, got {n}")
    # A per-family stream (seeded by family name too) so adding a family leaves the others' sets unchanged.
    rng = random.Random(f"{seed}:{family}")
    seen: dict[str, Example] = {}
    while len(seen) < HELDOUT_POOL:
        example = make_example(family, rng)
        seen.setdefault(example.prompt, example)
    return tuple(seen.values())[:n]


@lru_cache(maxsize=None)
def heldout_prompts() -> frozenset[str]:
    return frozenset(ex.prompt for family in FAMILIES for ex in heldout(family))


def training_stream(rng: random.Random | int, weights: dict[str, float] | None = None) -> Iterator[Example]:
    """An endless, deterministic stream of training examples that never yields a held-out prompt.

    Pass a `random.Random` to checkpoint the stream: the generator draws lazily, so saving the
    rng's state between draws captures exactly where the stream is.
    """
    rng = rng if isinstance(rng, random.Random) else random.Random(rng)
    weights = weights or {family: 1.0 for family in FAMILIES}
    names, shares = list(weights), list(weights.values())
    excluded = heldout_prompts()
    while True:
        example = make_example(rng.choices(names, shares)[0], rng)
        if example.prompt not in excluded:
            yield example
