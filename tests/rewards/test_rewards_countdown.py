"""countdown_reward: correct, wrong value, wrong numbers, disallowed syntax, and the policy choices."""

from fractions import Fraction

import pytest

from rewards import countdown_reward
from rewards.countdown import MAX_EXPRESSION_CHARS, MAX_NESTING, evaluate_expression

NUMBERS = [3, 5, 7, 8]
TARGET = 24  # (8 - 5) * 7 + 3 = 3 * 7 + 3 = 24

WRONG = 0.1


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        ("<answer>(7 - 5 + 8 / 8) * 8</answer>", WRONG),  # 8 three times, 3 missing
        ("<answer>3 * 8 * (7 - 5) / 2</answer>", WRONG),  # 2 is not given
        ("<answer>(8 - 5) * 7 + 3</answer>", 1.0),  # 3*7 + 3 = 24, uses 3 5 7 8 once each
        ("<answer>(8-5)*7+3</answer>", 1.0),  # spacing does not matter
        ("<answer> ((8 - 5) * 7) + 3 </answer>", 1.0),  # redundant parentheses are fine
        ("<answer>3 + 7 * (8 - 5)</answer>", 1.0),  # any order
        ("<answer>(8 - 5) * 7 + 3 + 0</answer>", WRONG),  # an extra number
        ("<answer>(8 - 5) * 7</answer>", WRONG),  # a missing number (and wrong value)
        ("<answer>(8 + 5) * 7 + 3</answer>", WRONG),  # right numbers, wrong value (94)
        ("Let me think.\n(8 - 5) * 7 + 3\n", 1.0),  # no tag: the last non-empty line
        ("(8 - 5) * 7 + 3\nso that is it", 0.0),  # ... which here is prose
        ("<answer>(8 - 5) * 7 + 3 = 24</answer>", 0.0),  # '=' is not part of the grammar
        ("<answer>(8 - 5) * 7 + 3</answer>\nThe answer is 24", 1.0),  # the tag wins over the last line
        ("<answer>(8 - 5) ** 7 + 3</answer>", 0.0),  # '**' does not parse
        ("<answer>(8 - 5) // 7 + 3</answer>", 0.0),  # '//' does not parse
        ("<answer>(8 - 5) % 7 + 3</answer>", 0.0),  # '%' does not parse
        ("<answer>(8 - 5) * 7.0 + 3</answer>", 0.0),  # integer literals only
        ("<answer>-(5 - 8) * 7 + 3</answer>", 0.0),  # no unary minus
        ("<answer>+(8 - 5) * 7 + 3</answer>", 0.0),  # no unary plus
        ("<answer>(8 - 5 * 7 + 3</answer>", 0.0),  # unbalanced
        ("<answer>(8 - 5) 7 + 3</answer>", 0.0),  # missing operator
        ("<answer></answer>", 0.0),
        ("", 0.0),
        ("<answer>__import__('os').system('echo pwned')</answer>", 0.0),
        ("<answer>(8 - 5) * 7 + 3 / (5 - 5)</answer>", WRONG),  # division by zero: parses, undefined
    ],
)
def test_countdown_reward(completion, expected):
    assert countdown_reward()(["p"], [completion], numbers=[NUMBERS], target=[TARGET]) == [expected]


def test_non_integer_intermediate_results_are_allowed():
    # 1 / 2 = 0.5 on the way; 0.5 * 4 = 2 exactly (Fraction, no rounding).
    fn = countdown_reward()
    assert fn(["p"], ["<answer>(1 / 2) * 4</answer>"], numbers=[[1, 2, 4]], target=[2]) == [1.0]
    # 1/3 * 3 is exactly 1, where floats would give 0.9999999999999999 for some orders.
    assert fn(["p"], ["<answer>1 / 3 * 3 * 7</answer>"], numbers=[[1, 3, 3, 7]], target=[7]) == [1.0]
    # The final value must equal the target exactly: 7 / 2 is 3.5, not 3.
    assert fn(["p"], ["<answer>7 / 2</answer>"], numbers=[[7, 2]], target=[3]) == [WRONG]


def test_numbers_are_a_multiset():
    fn = countdown_reward()
    assert fn(["p"], ["<answer>5 + 5</answer>"], numbers=[[5, 5]], target=[10]) == [1.0]
    assert fn(["p"], ["<answer>5 * 2</answer>"], numbers=[[5, 5]], target=[10]) == [WRONG]
    assert fn(["p"], ["<answer>5 + 5</answer>"], numbers=[[5]], target=[10]) == [WRONG]  # reused


def test_wrong_format_score_and_name():
    fn = countdown_reward(wrong_format_score=0.0)
    assert fn.__name__ == "countdown"
    completions = ["<answer>1 + 2</answer>", "<answer>1 + 1</answer>"]
    assert fn(["p", "p"], completions, numbers=[[1, 2]] * 2, target=[3] * 2) == [1.0, 0.0]


@pytest.mark.parametrize("value", [-0.1, 1.5, float("nan"), "0.1", True])
def test_wrong_format_score_is_validated(value):
    with pytest.raises(ValueError, match="wrong_format_score"):
        countdown_reward(wrong_format_score=value)


@pytest.mark.parametrize(
    ("numbers", "target", "match"),
    [(["1", "2"], 3, r"numbers\[0\]"), ([1, 2], 3.0, r"target\[0\]"), ([True, 2], 3, r"numbers\[0\]")],
)
def test_bad_task_data_raises_naming_the_field(numbers, target, match):
    with pytest.raises(ValueError, match=match):
        countdown_reward()(["p"], ["1 + 2"], numbers=[numbers], target=[target])


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1 + 2 * 3", (Fraction(7), [1, 2, 3])),  # precedence
        ("(1 + 2) * 3", (Fraction(9), [1, 2, 3])),
        ("8 - 3 - 2", (Fraction(3), [8, 3, 2])),  # left associative
        ("8 / 4 / 2", (Fraction(1), [8, 4, 2])),
        ("1 / (2 - 2)", (None, [1, 2, 2])),  # undefined
        ("(" * MAX_NESTING + "1" + ")" * MAX_NESTING, (Fraction(1), [1])),
        ("(" * (MAX_NESTING + 1) + "1" + ")" * (MAX_NESTING + 1), None),  # too deep
        ("1" + " + 1" * ((MAX_EXPRESSION_CHARS - 1) // 4), (Fraction(64), [1] * 64)),
        ("1" + " + 1" * (MAX_EXPRESSION_CHARS // 4), None),  # too long
        ("9" * 13, None),  # literal longer than 12 digits
        ("²", None),  # str.isdigit() would accept this
        ("1 2", None),
        ("()", None),
        ("", None),
    ],
)
def test_evaluate_expression(text, expected):
    assert evaluate_expression(text) == expected
