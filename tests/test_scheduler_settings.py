"""The scheduler setting and its options: one table row each, checked with one sentence."""

from __future__ import annotations

import pytest

from dgemma.errors import SettingsError
from dgemma.sampling import SCHEDULERS, SamplingParams
from dgemma.sampling.schedulers.block_refinement import BlockRefinementParams
from dgemma.sampling.schedulers.discrete_ddim import DiscreteDDIMParams
from dgemma.settings import BY_NAME, Settings, parse_settings


def test_every_scheduler_option_is_a_setting_of_the_scheduler_group():
    for name in ("scheduler", "temperature", "commit_threshold", "editing_threshold", "corrector_steps",
                 "corrector_k", "corrector_selection", "corrector_selection_tau"):
        assert BY_NAME[name].group == "scheduler"
    assert BY_NAME["scheduler"].choices == SCHEDULERS


def test_the_defaults_are_the_entropy_bound_and_diffusers_scheduler_defaults():
    p, refine, ddim = SamplingParams(), BlockRefinementParams(), DiscreteDDIMParams()
    assert (p.scheduler.name, refine.temperature, refine.commit_threshold, refine.editing_threshold) == (
        "entropy_bound", 0.0, 0.95, None)
    assert (ddim.temperature, ddim.corrector_steps, ddim.corrector_k, ddim.corrector_selection,
            ddim.corrector_selection_tau) == (0.0, 0, 1, "lowest_log_margin", 1.0)


def test_a_scheduler_and_its_options_parse_from_text_as_a_cli_gives_them():
    s = parse_settings({"scheduler": "discrete_ddim", "corrector-steps": "2", "corrector_selection": "random",
                        "temperature": "0.5"}, Settings())
    ddim = s.params.scheduler
    assert (ddim.name, ddim.corrector_steps, ddim.corrector_selection, ddim.temperature) == (
        "discrete_ddim", 2, "random", 0.5)


@pytest.mark.parametrize("off", ["off", "", "none"])
def test_editing_off_is_none(off):
    assert BlockRefinementParams.parse({"editing_threshold": off}) == {"editing_threshold": None}
    assert BlockRefinementParams.parse({"editing_threshold": "0"}) == {"editing_threshold": 0.0}  # 0 edits, as diffusers does
    with pytest.raises(TypeError):
        BlockRefinementParams(editing_threshold=off)  # text is the settings' to parse


def test_the_pages_editing_threshold_is_a_text_field_empty_for_off():
    from dgemma.ui.generate_tab.controls import page_value

    assert BY_NAME["editing_threshold"].widget == "text"  # a number field shows None as 0: editing on
    assert page_value(BY_NAME["editing_threshold"], Settings()) is None
    chosen = parse_settings({"scheduler": "block_refinement", "editing_threshold": "0.9"}, Settings())
    assert chosen.params.scheduler.editing_threshold == 0.9


@pytest.mark.parametrize("raw, sentence", [
    ({"scheduler": "ddpm"}, "Setting 'scheduler' must be one of entropy_bound, block_refinement, discrete_ddim, got 'ddpm'."),
    ({"corrector_selection": "best"}, "Setting 'corrector_selection' must be one of lowest_log_margin, lowest_maxprob, "
                                      "lowest_current_prob, random, got 'best'."),
    ({"corrector_k": 0}, "Setting 'corrector_k' must be between 1 and 4096, got 0."),
    ({"corrector_selection_tau": 0}, "Setting 'corrector_selection_tau' must be greater than 0, got 0."),
    ({"temperature": -0.5}, "Setting 'temperature' must be between 0 and 10, got -0.5."),
    ({"editing_threshold": "high"}, "Setting 'editing_threshold' must be a number, got 'high'."),
])  # fmt: skip
def test_a_bad_scheduler_value_gets_one_sentence(raw, sentence):
    with pytest.raises(SettingsError) as err:
        parse_settings(raw, Settings())
    assert str(err.value) == sentence
