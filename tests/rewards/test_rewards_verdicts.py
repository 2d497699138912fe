"""Verdict rules: a judge's reply text -> a score in [0, 1], or None (no valid verdict)."""

import math

import pytest

from rewards.verdicts import (
    MAX_VERDICT_CHARS,
    NumberVerdict,
    RubricVerdict,
    YesNoVerdict,
    make_verdict_rule,
    yes_probability,
)


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        ("Score: 7", 0.7),
        ("The answer is right but terse. 8/10", 0.8),  # 8 over high=10 reads as 8
        ("I rate it 6 out of 10.", 0.6),
        ("Step 1 is fine, step 2 too. Final: 9", 0.9),  # the last number counts
        ("0", 0.0),
        ("10", 1.0),
        ("2.5", 0.25),
        ("3/5", None),  # another scale: not silently read as 3/10
        ("no number here", None),
        ("", None),
        ("11", None),  # out of range: rejected by default
        ("-1", None),
        ("version v2 is good", None),  # a digit inside a word is no score
    ],
)
def test_number_verdict_default_range(reply, expected):
    assert NumberVerdict(low=0, high=10)(reply) == (None if expected is None else pytest.approx(expected))


def test_number_verdict_range_clip_first_and_label():
    # (x - low) / (high - low): (4 - 1) / (5 - 1) = 0.75
    assert NumberVerdict(low=1, high=5)("rating 4") == pytest.approx(0.75)
    assert NumberVerdict(low=1, high=5, out_of_range="clip")("rating 9") == 1.0
    assert NumberVerdict(low=1, high=5, out_of_range="clip")("rating 0") == 0.0
    assert NumberVerdict(low=0, high=10, which="first")("7, not 3") == pytest.approx(0.7)
    labelled = NumberVerdict(low=0, high=10, label="score")
    assert labelled("Has 3 errors. **Score:** 4. Checked 2 steps.") == pytest.approx(0.4)
    assert labelled("Has 3 errors.") is None


def test_number_verdict_huge_digit_run_is_no_number():
    assert NumberVerdict()("9" * 50) is None


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        ("Yes", 1.0),
        ("no.", 0.0),
        ("The completion says no, but the answer is correct: YES", 1.0),  # the last word counts
        ("Yesterday nobody knew", None),  # whole words only
        ("maybe", None),
    ],
)
def test_yes_no_verdict(reply, expected):
    assert YesNoVerdict()(reply) == expected


def test_yes_no_custom_words_and_first():
    rule = YesNoVerdict(yes_words=("correct",), no_words=("incorrect", "wrong"), which="first")
    assert rule("Incorrect. It would be correct with units.") == 0.0
    assert rule("Correct, not wrong") == 1.0


RUBRIC = """Evaluation:
- Correctness: 1
- Units: 0
- **Reasoning**: 1 (clear steps)
Note: see above
"""


def test_rubric_sums_lines_and_normalises():
    assert RubricVerdict()(RUBRIC) == pytest.approx(2 / 3)
    # Named criteria: only those count, any case.
    assert RubricVerdict(criteria=("correctness", "units"))(RUBRIC) == pytest.approx(1 / 2)
    # A named criterion missing: no verdict.
    assert RubricVerdict(criteria=("correctness", "style"))(RUBRIC) is None


def test_rubric_points_out_of_max():
    # (3 + 1) / (5 + 2) = 4/7 with per-line maxima; max_points for lines without one: (2 + 1) / (2 + 2)
    assert RubricVerdict()("1. accuracy: 3/5\n2. clarity: 1/2") == pytest.approx(4 / 7)
    assert RubricVerdict(max_points=2)("a: 2\nb: 1") == pytest.approx(3 / 4)


@pytest.mark.parametrize("reply", ["a: 2", "a: -1", "a: 1\nA: 0", "nothing to read", "a: 1/0"])
def test_rubric_rejects(reply):
    assert RubricVerdict()(reply) is None


def test_rubric_clip():
    assert RubricVerdict(out_of_range="clip")("a: 2\nb: 0") == pytest.approx(1 / 2)


def test_only_a_bounded_window_is_read():
    assert NumberVerdict()("8" + " " * MAX_VERDICT_CHARS) is None  # the score lies before the last window
    assert NumberVerdict(which="first")("8" + " " * MAX_VERDICT_CHARS) == pytest.approx(0.8)


def test_make_verdict_rule_by_name_and_yaml_lists():
    assert make_verdict_rule("number", low=0, high=5)("4") == pytest.approx(0.8)
    assert make_verdict_rule("rubric", criteria=["a", "b"])("a: 1\nb: 1") == 1.0
    assert make_verdict_rule("yes_no", yes_words=["pass"], no_words=["fail"])("pass") == 1.0
    with pytest.raises(ValueError, match="unknown verdict rule 'numbr'.*Did you mean 'number'"):
        make_verdict_rule("numbr")
    with pytest.raises(ValueError, match="no parameter 'hi'"):
        make_verdict_rule("number", hi=3)


@pytest.mark.parametrize(
    ("factory", "kwargs", "match"),
    [
        (NumberVerdict, {"low": 5, "high": 5}, "high > low"),
        (NumberVerdict, {"high": math.nan}, "finite"),
        (NumberVerdict, {"out_of_range": "wrap"}, "out_of_range"),
        (NumberVerdict, {"which": "middle"}, "which"),
        (NumberVerdict, {"label": " "}, "label"),
        (YesNoVerdict, {"yes_words": ()}, "yes_words"),
        (YesNoVerdict, {"yes_words": ("ok",), "no_words": ("OK",)}, "both yes and no"),
        (RubricVerdict, {"criteria": ("a", "A")}, "twice"),
        (RubricVerdict, {"max_points": 0}, "max_points"),
    ],
)
def test_bad_parameters(factory, kwargs, match):
    with pytest.raises(ValueError, match=match):
        factory(**kwargs)


def test_yes_probability():
    assert yes_probability(math.log(0.3), math.log(0.1)) == pytest.approx(0.75)  # 0.3 / (0.3 + 0.1)
    assert yes_probability(-1000.0, 0.0) == pytest.approx(0.0, abs=1e-300)  # no overflow
    assert yes_probability(0.0, -1000.0) == pytest.approx(1.0)
    assert yes_probability(-math.inf, -2.0) == 0.0
    with pytest.raises(ValueError, match="probability 0"):
        yes_probability(-math.inf, -math.inf)
    with pytest.raises(ValueError, match="logp_no"):
        yes_probability(-1.0, 0.5)
