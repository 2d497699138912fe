"""numeric_answer, gsm8k_reward and boxed_reward: tables of (completion, reference, score) with near misses."""

from fractions import Fraction

import pytest

from rewards import boxed_reward, gsm8k_reward, numeric_answer, numeric_answer_reward


def score_one(fn, completion, reference):
    scores = fn(["prompt"], [completion], answer=[reference])
    assert len(scores) == 1
    return scores[0]


@pytest.mark.parametrize(
    ("completion", "reference", "expected"),
    [
        ("The answer is 42", "42", 1.0),
        ("The answer is 42.0", "42", 1.0),  # trailing zeros
        ("The answer is 42.50", "42.5", 1.0),
        ("so 1,000 in total", "1000", 1.0),  # thousands separator in the completion
        ("so 1000 in total", "1,000", 1.0),  # ... and in the reference
        ("+5", "5", 1.0),
        ("-0", "0", 1.0),
        ("3/4", "0.75", 1.0),  # simple fraction against a decimal
        ("0.75", "3/4", 1.0),
        ("It is 42", 42, 1.0),  # int reference
        ("It is 0.1", 0.1, 1.0),  # float reference, compared as its decimal repr
        ("It is 3/4", Fraction(3, 4), 1.0),
        ("first 42, then finally 43", "42", 0.0),  # only the last number counts
        ("The answer is 42.01", "42", 0.0),
        ("-42", "42", 0.0),
        ("4,200", "42", 0.0),
        ("no number", "42", 0.0),
        ("", "42", 0.0),
        ("1e3", "1000", 0.0),  # exponents are not numbers here
        ("10-5", "-5", 0.0),  # subtraction, not -5
    ],
)
def test_numeric_answer(completion, reference, expected):
    assert score_one(numeric_answer, completion, reference) == expected


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        ("<think>7 * 6 is 42, not 41</think><answer>42</answer>", 1.0),
        ("<answer>The total is 42 apples</answer>", 1.0),  # the last number inside the tag
        ("<answer>41</answer> and 42 after the tag", 0.0),  # text after the tag is ignored
        ("<think>42</think>", 0.0),  # no answer tag
        ("<answer>42", 0.0),  # unclosed
        ("<answer>1</answer><answer>42</answer>", 1.0),  # the last pair
    ],
)
def test_numeric_answer_with_answer_tag(completion, expected):
    fn = numeric_answer_reward(answer_tag=True)
    assert fn.__name__ == "numeric_answer_tag"
    assert score_one(fn, completion, "42") == expected


def test_numeric_answer_rejects_a_non_numeric_reference_naming_it():
    with pytest.raises(ValueError, match=r"answer\[1\] = 'forty-two' is not a number"):
        numeric_answer(["p", "p"], ["42", "42"], answer=["42", "forty-two"])


def test_reward_functions_reject_misaligned_answers():
    with pytest.raises(ValueError, match="answer has 1 entries for 2 completions"):
        numeric_answer(["p", "p"], ["1", "2"], answer=["1"])


GSM8K_SOLUTION = "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nAltogether 48+24 = <<48+24=72>>72 clips.\n#### 72"


@pytest.mark.parametrize(
    ("completion", "reference", "expected"),
    [
        ("She sold 72 clips.\n#### 72", "72", 1.0),
        ("#### 1,234", "1234", 1.0),  # thousands separator
        ("#### 1234", "1,234", 1.0),
        ("#### $18.00", "18", 1.0),
        ("#### 72", GSM8K_SOLUTION, 1.0),  # reference is a whole GSM8K solution
        ("#### 72", 72, 1.0),
        ("#### 70\ncorrection: #### 72", "72", 1.0),  # the last ####
        ("#### 72\ncorrection: #### 70", "72", 0.0),
        ("The answer is 72", "72", 0.0),  # no ####
        ("#### seventy-two", "72", 0.0),
        ("#### 71", GSM8K_SOLUTION, 0.0),
        ("#### -72", "72", 0.0),
    ],
)
def test_gsm8k_reward(completion, reference, expected):
    assert score_one(gsm8k_reward, completion, reference) == expected


def test_gsm8k_reward_rejects_a_reference_without_a_number_after_its_mark():
    with pytest.raises(ValueError, match=r"answer\[0\]"):
        gsm8k_reward(["p"], ["#### 1"], answer=["#### none"])


@pytest.mark.parametrize(
    ("completion", "reference", "expected"),
    [
        (r"so \boxed{42}", "42", 1.0),
        (r"\boxed{42.0}", "42", 1.0),
        (r"\boxed{\frac{1}{2}}", "0.5", 1.0),  # nested braces; \frac against a decimal
        (r"\boxed{\dfrac{3}{4}}", "3/4", 1.0),
        (r"\boxed{\tfrac{3}{4}}", r"\frac{3}{4}", 1.0),
        (r"\boxed{\frac34}", "0.75", 1.0),  # \frac with single-digit arguments
        (r"\boxed{-\frac{1}{2}}", "-0.5", 1.0),
        (r"\boxed{\frac{-1}{2}}", "-1/2", 1.0),
        (r"\boxed{+7}", "7", 1.0),
        (r"$\boxed{ 1{,}000 }$", "1000", 1.0),
        (r"\boxed{1,000}", "1000", 1.0),
        (r"\boxed{\left( 1, 2 \right)}", "(1,2)", 1.0),  # non-numeric: normalised strings
        (r"\boxed{\text{(B)}}", "(B)", 1.0),
        (r"\boxed{x = 5}", "5", 1.0),
        (r"\boxed{90^\circ}", "90", 1.0),
        (r"\boxed{50\%}", "50", 1.0),
        (r"\boxed{3\sqrt{2}}", r"3 \sqrt{2}", 1.0),
        (r"\boxed{2}", r"The area is $\boxed{2}$.", 1.0),  # reference is a MATH solution
        (r"\boxed{1} then \boxed{2}", "2", 1.0),  # the last box counts
        (r"\boxed{2} then \boxed{1}", "2", 0.0),
        (r"\boxed{\frac{1}{3}}", "0.33", 0.0),  # exact comparison
        (r"\boxed{\frac{1}{0}}", "0", 0.0),
        (r"\boxed{42", "42", 0.0),  # unbalanced
        (r"\boxed{}", "", 0.0),  # empty answer is never right
        ("42", "42", 0.0),  # no box
        (r"\boxed{3\sqrt{2}}", r"\sqrt{18}", 1.0),  # symbolically equal (rewards.symbolic)
        (r"\boxed{3\sqrt{2}}", r"\sqrt{19}", 0.0),
        (r"\boxed{(1,2)}", "(2,1)", 0.0),
    ],
)
def test_boxed_reward(completion, reference, expected):
    assert score_one(boxed_reward, completion, reference) == expected


def test_reward_functions_accept_and_ignore_unknown_fields():
    assert numeric_answer(["p"], ["42"], answer=["42"], target=[1], numbers=[[1]]) == [1.0]
    assert gsm8k_reward(["p"], ["#### 42"], answer=["42"], unrelated=["x"]) == [1.0]
    assert boxed_reward(["p"], [r"\boxed{42}"], answer=["42"], unrelated=["x"]) == [1.0]


def test_names_are_the_registry_names():
    names = (numeric_answer.__name__, gsm8k_reward.__name__, boxed_reward.__name__)
    assert names == ("numeric_answer", "gsm8k", "boxed")
