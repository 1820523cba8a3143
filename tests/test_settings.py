"""One settings type: SamplingParams + RunOptions + max_new_tokens, one parser, one set of bounds."""

from __future__ import annotations

import pytest

from dgemma.errors import SettingsError
from dgemma.memory import MiB
from dgemma.sampling import MAX_SEED, MAX_STABILITY, RunOptions, SamplingParams
from dgemma.settings import Settings, name_value_pairs, parse_settings


@pytest.mark.parametrize(
    "name, value",
    [("stability_threshold", MAX_STABILITY + 1), ("seed", -1), ("max_denoising_steps", 0), ("entropy_bound", 0),
     ("t_min", float("nan")), ("greedy", "maybe")],
)
def test_the_types_and_the_parser_refuse_with_the_same_sentence(name, value):
    with pytest.raises(SettingsError) as direct:
        SamplingParams(**{name: value})
    with pytest.raises(SettingsError) as parsed:
        parse_settings({name: value}, Settings())
    assert str(direct.value) == str(parsed.value)
    assert str(direct.value).startswith(f"Setting '{name}' ") and str(direct.value).endswith(".")


def test_text_values_are_parsed_at_the_edge_and_the_types_hold_typed_values():
    parsed = parse_settings({"seed": "7", "greedy": "yes", "max_denoising_steps": "16", "t_min": "0.5", "tiling": " 4 ",
                             "memory_budget": "512MiB"}, Settings())
    params, options = parsed.params, parsed.options
    assert (params.seed, params.greedy, params.max_denoising_steps, params.t_min) == (7, True, 16, 0.5)
    assert (options.tiling, options.memory_budget) == (4, 512 * MiB)
    for text in (dict(seed="7"), dict(greedy="yes"), dict(greedy=1), dict(max_denoising_steps=16.0)):
        with pytest.raises(TypeError, match="parsed by dgemma/settings.py"):
            SamplingParams(**text)
    for text in (dict(tiling=" 4 "), dict(memory_budget="512MiB")):
        with pytest.raises(TypeError, match="dgemma/settings.py parses text"):
            RunOptions(**text)


def test_a_seed_as_text_keeps_all_64_bits():
    assert parse_settings({"seed": str(MAX_SEED)}, Settings()).params.seed == MAX_SEED


def test_seed_s_gives_prompt_i_the_seed_s_plus_i():
    settings = parse_settings({"seed": 10}, Settings(), prompts=3)
    assert [settings.params.for_prompt(i).seed for i in range(3)] == [10, 11, 12]
    assert settings.params.for_prompt(2).t_min == settings.params.t_min


def test_the_seed_must_leave_room_for_every_prompt():
    assert parse_settings({"seed": MAX_SEED}, Settings(), prompts=1).params.seed == MAX_SEED
    with pytest.raises(SettingsError, match=f"at most {MAX_SEED - 2} for 3 prompts"):
        parse_settings({"seed": MAX_SEED - 1}, Settings(), prompts=3)


def test_settings_split_into_params_options_and_length():
    s = parse_settings({"max-new-tokens": 8, "t_max": 0.9, "tiling": "off", "sampler": "chunked",
                        "memory_budget": "64MiB"}, Settings())
    assert s == Settings(SamplingParams(t_max=0.9), RunOptions("off", "chunked", 64 * MiB), 8)


def test_limits_bound_the_length_and_the_tile_size():
    with pytest.raises(SettingsError, match="'max_new_tokens' must be between 1 and 16"):
        parse_settings({"max_new_tokens": 17}, Settings(), max_new_tokens=16)
    with pytest.raises(SettingsError, match="a tile size from 1 to 4"):
        parse_settings({"tiling": 5}, Settings(), max_tile=4)
    assert parse_settings({"tiling": 5}, Settings()).options.tiling == 5  # no engine limit given


def test_null_means_the_default_and_the_defaults_are_kept():
    defaults = Settings(SamplingParams(seed=3, greedy=True), RunOptions(sampler="chunked"), 12)
    assert parse_settings({"seed": None, "tiling": None}, defaults) == defaults
    assert parse_settings(None, defaults) == defaults


def test_the_table_names_every_sampling_param_and_each_name_is_a_field_of_a_call():
    from dgemma.sampling.schedulers import SCHEDULER_TABLE
    from dgemma.settings import BY_NAME, NAMES, SETTINGS

    options = {option for scheduler in SCHEDULER_TABLE.values() for option in scheduler.Params.options()}
    assert {f for f in SamplingParams.__dataclass_fields__} | options <= set(NAMES)
    call_fields = {*SamplingParams.__dataclass_fields__, *options, *RunOptions.__dataclass_fields__,
                   *Settings.__dataclass_fields__}
    assert set(NAMES) <= call_fields and len(NAMES) == len(BY_NAME) == len(SETTINGS)


def test_a_name_outside_the_table_is_refused_by_the_one_parser():
    with pytest.raises(SettingsError, match="Unknown setting 'params'"):
        parse_settings({"params": 1}, Settings())


def test_the_cli_the_api_docs_and_the_page_take_their_settings_from_the_table():
    from dgemma.generate import parse_args
    from dgemma.settings import SETTINGS, api_help

    args = vars(parse_args([]))
    docs = api_help()
    for setting in SETTINGS:
        assert setting.name in args and f"{setting.name} [" in docs and setting.help in docs
    assert parse_args(["--confidence-threshold", "0.5", "--pin", "0=x"]).confidence_threshold == "0.5"


def test_name_value_parts_keep_the_value_as_written_and_skip_blank_parts():
    assert name_value_pairs([" 3 = x", "", "  ", "5=a=b"], "{part!r}") == {"3": " x", "5": "a=b"}


@pytest.mark.parametrize("part", ["seven", "=x", " =x "])
def test_a_part_without_a_name_or_an_equals_sign_is_the_callers_sentence(part):
    with pytest.raises(SettingsError, match=f"^got {part.strip()!r}\\.$"):
        name_value_pairs(["a=1", part], "got {part!r}.")


@pytest.mark.parametrize("pins, sentence", [
    ({"-1": "a"}, "Setting 'pins': a pin's position must be a whole number from 0, got '-1'."),
    ({"two": "a"}, "Setting 'pins': a pin's position must be a whole number from 0, got 'two'."),
    ({2: ""}, "Setting 'pins': the token at position 2 must be text, got empty text."),
    ("2=a", "Setting 'pins' must be an object of position: token text pairs, got str."),
])  # fmt: skip
def test_a_pin_that_is_not_a_position_and_a_token_is_refused_at_the_door(pins, sentence):
    with pytest.raises(SettingsError) as refused:
        parse_settings({"pins": pins}, Settings())
    assert str(refused.value) == sentence


def test_pins_from_json_keys_are_positions_at_the_door():
    assert parse_settings({"pins": {"5": "xy", 0: "c"}}, Settings()).pins == (((0, "c"), (5, "xy")),)
