"""The judge's template, verdict glue and settings: pure Python, hand-checked values."""

import math

import pytest
from rewards.verdicts import NumberVerdict, YesNoVerdict, yes_probability
from rl_core.config import ConfigError

from trainer.judge import DEFAULT_TEMPLATE, JudgeSettings, JudgeTemplate, verdict_scores


def test_the_template_fills_each_place_and_leaves_model_text_alone():
    template = JudgeTemplate("Q {prompt} A {completion} R {reference}")
    # braces in a completion are text, not places
    assert template.render(["1+1="], ["{reference}2"], [2]) == ["Q 1+1= A {reference}2 R 2"]
    assert template.needs_reference


def test_a_template_without_reference_needs_none():
    template = JudgeTemplate("{completion}?")
    assert not template.needs_reference
    assert template.render(["p", "q"], ["a", "b"], None) == ["a?", "b?"]


@pytest.mark.parametrize(("text", "problem"), [
    ("{prompt} {answer}", r"\{answer\} is not one of"),
    ("{prompt} only", r"no \{completion\}"),
    ("{completion!r}", "no format spec or conversion"),
    ("{completion:>9}", "no format spec or conversion"),
    ("{0}", r"\{0\} is not one of"),
    ("{completion", "not a format string"),
    ("", "non-empty"),
])  # fmt: skip
def test_bad_templates_name_the_problem(text, problem):
    with pytest.raises(ValueError, match=problem):
        JudgeTemplate(text)


def test_the_default_template_needs_a_reference_and_holds_only_plain_characters():
    template = JudgeTemplate(DEFAULT_TEMPLATE)
    assert template.needs_reference and DEFAULT_TEMPLATE.isascii()


def test_verdict_scores_count_replies_without_a_verdict():
    # "yes" -> 1, "No." -> 0, "maybe" has none -> the unparsed score 0.25, counted once
    scores, unparsed = verdict_scores(["yes", "No.", "maybe"], YesNoVerdict(), 0.25)
    assert (scores, unparsed) == ([1.0, 0.0, 0.25], 1)
    # 7 on [0, 10] -> 0.7; 12 is out of range (rejected) -> the unparsed score 0
    scores, unparsed = verdict_scores(["Score: 7", "12"], NumberVerdict(low=0, high=10), 0.0)
    assert scores == pytest.approx([0.7, 0.0]) and unparsed == 1


def test_yes_probability_of_two_logprobs():
    # p(yes) = 0.3, p(no) = 0.1 -> 0.75; the remaining 0.6 of the mass does not count
    assert yes_probability(math.log(0.3), math.log(0.1)) == pytest.approx(0.75)


def test_judge_settings_are_off_until_a_model_is_named():
    assert not JudgeSettings().on
    assert JudgeSettings(run="runs/judge").on and JudgeSettings(path="models/judge").on


@pytest.mark.parametrize(("fields", "problem"), [
    ({"path": "a", "run": "b"}, "path and run are both set"),
    ({"run_step": 3}, "needs judge.run"),
    ({"verdict": "score"}, "must be one of"),
    ({"verdict": "number", "verdict_options": {"low": 5, "high": 1}}, "high > low"),
    ({"verdict": "yes_probability", "verdict_options": {"low": 0}}, "takes none"),
    ({"verdict": "yes_probability", "no_word": "yes"}, "two different"),
    ({"template": "{prompt}"}, r"no \{completion\}"),
    ({"unparsed_score": 2.0}, r"must be in \[0, 1\]"),
    ({"engine": "sglang"}, "unknown engine 'sglang'"),
    ({"name": "my judge"}, "must be a word"),
])  # fmt: skip
def test_bad_judge_settings_name_the_field(fields, problem):
    with pytest.raises(ConfigError, match=problem):
        JudgeSettings(**fields)
