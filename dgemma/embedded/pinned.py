"""What the teaching model does around a pinned token (`python -m dgemma.embedded.eval --pins`).

For each held-out prompt of a checkable family one position of its answer (the middle character
that is not a space, inside the first canvas) is pinned, once to the right character and once to a
wrong one of the same kind (the next digit, the next letter), and the engine runs the prompt
greedily with the same seed as unpinned. Per family:

- exact_match: unpinned, the answers that are right;
- pinned_correct_exact_match: with the right character pinned, the answers that are right;
- pinned_wrong_held: with a wrong character pinned, the answers holding it at its position (the
  pin holds unless the model ends the answer before it);
- pinned_wrong_rest_correct: with a wrong character pinned, the answers right everywhere else
  (same length, every other position the true answer's): whether the model works around the pin
  or lets it change the rest.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from transformers.models.diffusion_gemma.generation_diffusion_gemma import DiffusionGemmaGenerationConfig

from dgemma.embedded import corpus


def pin_position(answer: str, canvas_length: int) -> int | None:
    """The middle non-space position of the answer's first canvas; None for an answer of spaces."""
    places = [i for i, c in enumerate(answer[:canvas_length]) if c != " "]
    return places[len(places) // 2] if places else None


def wrong_character(right: str) -> str:
    """A wrong character of the same kind: the next digit, the next letter, else a period."""
    for alphabet in (corpus.DIGITS, corpus.LETTERS):
        if right in alphabet:
            return alphabet[(alphabet.index(right) + 1) % len(alphabet)]
    return "." if right != "." else ","


def rest_correct(text: str, answer: str, position: int) -> bool:
    return len(text) == len(answer) and all(t == a for i, (t, a) in enumerate(zip(text, answer)) if i != position)


def pinned_rows(generate_engine: Callable[..., list], model_dir: Path, families: list[str], n: int,
                config: DiffusionGemmaGenerationConfig, seed: int, canvas_length: int) -> list[dict]:
    """One row per checkable family in `families` (see the module's docstring); `generate_engine`
    is eval's engine impl (it takes `pins=`, one {position: piece} per prompt)."""
    rows = []
    for family in [f for f in families if f in corpus.CHECKABLE]:
        examples = [ex for ex in corpus.heldout(family, n) if pin_position(ex.answer, canvas_length) is not None]
        prompts = [ex.prompt for ex in examples]
        places = [pin_position(ex.answer, canvas_length) for ex in examples]
        right = [{p: ex.answer[p]} for ex, p in zip(examples, places)]
        wrong = [{p: wrong_character(ex.answer[p])} for ex, p in zip(examples, places)]
        plain = generate_engine(model_dir, prompts, config, seed)
        with_right = generate_engine(model_dir, prompts, config, seed, pins=right)
        with_wrong = generate_engine(model_dir, prompts, config, seed, pins=wrong)

        def share(hits: list[bool]) -> float:
            return round(sum(hits) / max(1, len(hits)), 4)

        rows.append({
            "impl": "engine-pinned", "family": family, "n": len(examples),
            "exact_match": share([g.text == ex.answer for g, ex in zip(plain, examples)]),
            "pinned_correct_exact_match": share([g.text == ex.answer for g, ex in zip(with_right, examples)]),
            "pinned_wrong_held": share([g.text[p : p + 1] == w[p] for g, p, w in zip(with_wrong, places, wrong)]),
            "pinned_wrong_rest_correct": share([rest_correct(g.text, ex.answer, p)
                                                for g, ex, p in zip(with_wrong, examples, places)]),
        })  # fmt: skip
    return rows
