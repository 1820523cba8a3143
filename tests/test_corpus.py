"""The embedded model's corpus and tokenizer: seeded, held out, and fully tokenizable."""

import itertools
import random

from transformers import AutoTokenizer

from dgemma.embedded import corpus
from dgemma.embedded.tokenizer import BOS_ID, EOS_ID, PAD_ID, build_tokenizer


def take(seed: int, n: int) -> list[corpus.Example]:
    return list(itertools.islice(corpus.training_stream(seed), n))


def test_training_stream_is_deterministic_per_seed():
    assert take(7, 300) == take(7, 300)
    assert take(7, 300) != take(8, 300)


def test_training_stream_resumes_from_a_saved_rng_state():
    rng = random.Random(3)
    stream = corpus.training_stream(rng)
    head = list(itertools.islice(stream, 50))
    state = rng.getstate()
    tail = list(itertools.islice(stream, 50))
    resumed = random.Random()
    resumed.setstate(state)
    assert head + list(itertools.islice(corpus.training_stream(resumed), 50)) == head + tail


def test_heldout_prompts_never_appear_in_the_training_stream():
    heldout = corpus.heldout_prompts()
    assert len(heldout) == corpus.HELDOUT_POOL * len(corpus.FAMILIES)
    assert not heldout & {ex.prompt for ex in take(0, 20_000)}


def test_heldout_set_is_fixed_and_every_family_is_covered():
    for family in corpus.FAMILIES:
        examples = corpus.heldout(family, 20)
        assert len({ex.prompt for ex in examples}) == 20
        assert all(ex.family == family for ex in examples)
    assert corpus.heldout("add", 5)[0].prompt == corpus.heldout("add", 50)[0].prompt


def test_checkable_answers_are_right():
    for ex in take(1, 2000):
        words = ex.prompt.split()
        if ex.family == "add":
            a, b = words[1].split("+")
            assert int(ex.answer) == int(a) + int(b)
        elif ex.family == "reverse":
            assert ex.answer == words[1][::-1]
        elif ex.family == "sort":
            assert ex.answer.split() == sorted(words[1:])
        elif ex.family == "count":
            assert ex.answer.split() == [str(i) for i in range(int(words[1]), int(words[3]) + 1)]
        elif ex.family == "repeat":
            assert ex.answer == words[1] * int(words[2])
        else:
            assert all(word in corpus.LEXICON for word in corpus.words(ex.answer))


def test_saved_tokenizer_loads_with_specials_and_round_trips_every_example(tmp_path):
    build_tokenizer().save_pretrained(tmp_path)
    tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    assert (tokenizer.pad_token_id, tokenizer.eos_token_id, tokenizer.bos_token_id) == (PAD_ID, EOS_ID, BOS_ID)
    for ex in take(2, 500):
        for text in (ex.prompt, ex.answer):
            ids = tokenizer(text).input_ids
            assert ids[0] == BOS_ID and len(ids) == len(text) + 1
            assert tokenizer.decode(ids, skip_special_tokens=True) == text


def test_the_scope_grammar_accepts_every_prompt_the_model_was_trained_or_tested_on():
    from dgemma.embedded import scope

    examples = [e for f in corpus.FAMILIES for e in corpus.heldout(f)] + take(11, 3000)
    assert [scope.family(e.prompt) for e in examples] == [e.family for e in examples]
    assert all(scope.note(e.prompt) == "" for e in examples)


def test_a_prompt_outside_every_family_gets_the_note_naming_the_families():
    from dgemma.embedded import scope

    for prompt in ("what is 2+2?", "Hello, who are you?", "add 7+5", "count 1 to 80", "reverse ab", "sort 1"):
        assert scope.family(prompt) is None, prompt
        note = scope.note(prompt)
        assert "two-digit addition (add 12+34)" in note and "story: big cat, park" in note and "example prompts" in note
