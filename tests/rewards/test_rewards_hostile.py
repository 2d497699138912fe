"""Untrusted completions: every reward function returns in bounded time, never raises and never runs model text.

Each call runs in a daemon thread with a generous deadline (``result(timeout=...)``):
a deadline that catches a hang or a blow-up, not a timing claim. A daemon thread
cannot keep a hung test process alive.
"""

import threading
from concurrent.futures import Future

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rewards import (
    RewardManager,
    boxed_reward,
    countdown_reward,
    format_reward,
    gsm8k_reward,
    length_penalty,
    numeric_answer,
    numeric_answer_reward,
)
from rewards.countdown import evaluate_expression

DEADLINE_S = 10

# (function, its documented score range)
FUNCTIONS = [
    (numeric_answer, {0.0, 1.0}),
    (numeric_answer_reward(answer_tag=True), {0.0, 1.0}),
    (gsm8k_reward, {0.0, 1.0}),
    (boxed_reward, {0.0, 1.0}),
    (format_reward(strict=True), {0.0, 1.0}),
    (format_reward(strict=False), {0.0, 1.0}),
    (countdown_reward(), {0.0, 0.1, 1.0}),
    (length_penalty(max_chars=1_000, buffer_chars=500), None),  # any value in [-1, 0]
]
NAMES = [fn.__name__ for fn, _ in FUNCTIONS]

NESTING = 100_000
HOSTILE = {
    "import": "__import__('os').system('echo pwned')",
    "import_in_tags": "<think>x</think><answer>__import__('os').system('echo pwned')</answer>",
    "lambda": "lambda: 1",
    "dunder": "(1).__class__.__bases__[0].__subclasses__()",
    "power_tower": "9**9**9**9",
    "power_tower_boxed": r"\boxed{9**9**9**9} #### 9**9**9**9 <answer>9**9**9**9</answer>",
    "million_digits": "7" * 1_000_000,
    "million_digits_everywhere": (
        "#### " + "7" * 1_000_000 + r" \boxed{" + "7" * 1_000_000 + "} <answer>" + "7" * 10_000 + "</answer>"
    ),
    "digits_with_commas": "1" + ",000" * 100_000,
    "100kb": "The answer is 42. " * 5_700,
    "nested_parens": "(" * NESTING + "1" + ")" * NESTING,
    "nested_parens_in_tag": "<answer>" + "(" * NESTING + "1" + ")" * NESTING + "</answer>",
    "nested_boxed": "\\boxed{" * NESTING + "1" + "}" * NESTING,
    "nested_braces": "{" * NESTING + "1" + "}" * NESTING,
    "unclosed_boxed": "\\boxed{" * NESTING,
    "nested_frac": r"\boxed{" + r"\frac{" * 10_000 + "1" + "}{2}" * 10_000 + "}",
    "many_tags": "<think>" * 50_000 + "</answer>" * 50_000,
    "many_marks": "#### " * 50_000,
    "nul": "\x00#### 4\x00<answer>1+2</answer>\x00",
    "lone_surrogate": "\ud800 #### 4 \\boxed{\udfff}",
    "surrogateescape": b"\xff\xfe #### 4".decode("utf-8", "surrogateescape"),
    "empty": "",
    "whitespace": " \n\t\r" * 1000,
    "long_number_then_text": "9" * 5_000 + " apples",
    "sign_soup": "-+" * 50_000 + "1",
    "slash_soup": "1/" * 50_000 + "1",
    "decimal_soup": "1." * 50_000,
    "exponent": "#### 1e999999999 \\boxed{1e999999999}",
    # short enough for the symbolic comparison of boxed answers: each must be refused or stay cheap
    "power_of_powers": r"\boxed{((2^{64})^{64})^{64}}",
    "power_tower_latex": r"\boxed{9^{9^{9^{9}}}}",
    "big_polynomial": r"\boxed{(x+y+z)^{24}(x+y+z)^{24}}",
    "root_tower": "\\boxed{" + r"\sqrt{" * 60 + "2" + "}" * 61,
    "deep_parens_short": "\\boxed{" + "(" * 90 + "x" + ")" * 90 + "}",
    "divide_by_zero": r"\boxed{\frac{1}{0}+\frac{x}{x-x}}",
    "many_variables": r"\boxed{a+b+c+d+f+g}",
    "huge_set": r"\boxed{\{" + ",".join(map(str, range(60))) + r"\}}",
    "sympy_bait": r"\boxed{Symbol('x').__class__}",
    "fullwidth_minus": "#### \uff0d42 \\boxed{\uff0d42} <answer>\uff0d42</answer>",
    "small_minus": "#### \ufe6342 \\boxed{\ufe6342} <answer>\ufe6342</answer>",
    "heavy_minus": "#### \u279642 \\boxed{\u279642}",
    "modifier_minus": "#### \u02d742 \\boxed{\u02d742}",
    "minus_sign": "#### \u221242 \\boxed{\u221242}",
    "en_dash": "#### \u201342 \\boxed{\u201342}",
    "em_dash": "#### \u201442 \\boxed{\u201442}",
    "hyphen": "#### \u201042 \\boxed{\u201042}",
}
FIELDS = {"answer": "42", "numbers": [1, 2, 3], "target": 6}


def call_with_deadline(fn, *args, **kwargs):
    future = Future()

    def run():
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            future.set_exception(exc)

    threading.Thread(target=run, daemon=True).start()
    return future.result(timeout=DEADLINE_S)


def assert_in_range(fn, valid, scores, n):
    assert isinstance(scores, list) and len(scores) == n
    for score in scores:
        assert isinstance(score, float)
        if valid is None:
            assert -1.0 <= score <= 0.0, (fn.__name__, score)
        else:
            assert score in valid, (fn.__name__, score)


@pytest.mark.parametrize(("fn", "valid"), FUNCTIONS, ids=NAMES)
def test_every_function_scores_the_hostile_corpus_in_bounded_time(fn, valid):
    completions = list(HOSTILE.values())
    n = len(completions)
    fields = {key: [value] * n for key, value in FIELDS.items()}
    scores = call_with_deadline(fn, ["prompt"] * n, completions, **fields)
    assert_in_range(fn, valid, scores, n)


@pytest.mark.parametrize(
    ("fn", "reference"),
    [
        (numeric_answer, "42"),
        (gsm8k_reward, "1,000"),
        (boxed_reward, "42"),
        (boxed_reward, "\\frac{1}{2}"),
        (boxed_reward, "(1,2)"),
    ],
)
def test_hostile_text_scores_zero_against_real_answers(fn, reference):
    # None of these completions holds a right answer, whatever each function reads as its answer
    # ("100kb" really does end in "42").
    completions = [text for key, text in HOSTILE.items() if key != "100kb"]
    n = len(completions)
    assert call_with_deadline(fn, ["p"] * n, completions, answer=[reference] * n) == [0.0] * n


def test_the_manager_scores_the_hostile_corpus_with_every_function():
    manager = RewardManager([fn for fn, _ in FUNCTIONS], max_workers=4)
    completions = list(HOSTILE.values())
    n = len(completions)
    fields = {key: [value] * n for key, value in FIELDS.items()}
    result = call_with_deadline(manager.score, ["prompt"] * n, completions, fields)
    assert result.num_failed == 0
    assert len(result.total) == n
    assert set(result.per_function) == set(NAMES)


MINUS_FORMS = {"fullwidth": "\uff0d", "small": "\ufe63", "heavy": "\u2796", "modifier": "\u02d7", "minus": "\u2212"}
GSM8K_MINUS = [f"#### {m}72" for m in MINUS_FORMS.values()]


@pytest.mark.parametrize(("fn", "wrap"), [
    (numeric_answer, "The answer is {}."),
    (gsm8k_reward, "So #### {}"),
    (boxed_reward, "\\boxed{{{}}}"),
    (numeric_answer_reward(answer_tag=True), "<answer>{}</answer>"),
], ids=["numeric_answer", "gsm8k", "boxed", "answer_tag"])
@pytest.mark.parametrize("minus", list(MINUS_FORMS.values()), ids=list(MINUS_FORMS))
def test_a_unicode_minus_never_earns_credit_for_the_positive_answer(fn, wrap, minus):
    completion = wrap.format(f"{minus}72")
    assert call_with_deadline(fn, ["p"], [completion], answer=["72"]) == [0.0]
    assert call_with_deadline(fn, ["p"], [completion], answer=["-72"]) == [1.0]


@pytest.mark.parametrize("dash", ["\u2010", "\u2011", "\u2012", "\u2013", "\u2014"])
@pytest.mark.parametrize("fn", [numeric_answer, gsm8k_reward, boxed_reward], ids=["numeric_answer", "gsm8k", "boxed"])
def test_a_dash_before_the_answer_earns_credit_for_neither_sign(fn, dash):
    completion = f"#### {dash}72" if fn is gsm8k_reward else f"\\boxed{{{dash}72}}" if fn is boxed_reward else f"x = {dash}72"
    assert call_with_deadline(fn, ["p"], [completion], answer=["72"]) == [0.0]
    assert call_with_deadline(fn, ["p"], [completion], answer=["-72"]) == [0.0]


def test_model_text_is_never_executed(tmp_path):
    marker = tmp_path / "pwned"
    payload = f"__import__('os').system('touch {marker}')"
    completions = [
        payload,
        f"<answer>{payload}</answer>",
        f"<think>x</think><answer>{payload}</answer>",
        f"\\boxed{{{payload}}}",
        f"#### {payload}",
        f"exec({payload!r})",
        f"eval({payload!r})",
    ]
    n = len(completions)
    for fn, _ in FUNCTIONS:
        call_with_deadline(fn, ["p"] * n, completions, answer=["1"] * n, numbers=[[1]] * n, target=[1] * n)
    assert not marker.exists()


TOKENS = [
    "0", "1", "2", "7", "42", "1,000", "3/4", ".5", "-", "+", "*", "/", "**", "//", "%", "(", ")", "=",
    "{", "}", "\\boxed{", "\\frac{", "\\dfrac", "\\text{", "$", "####", "<think>", "</think>", "<answer>",
    "</answer>", " ", "\n", "\x00", "\ud800", "e", "x",
    "\\sqrt{", "^", "^{", "\\{", "\\}", "\\pi", ",", "y", "\\cdot", "\\infty",
]  # fmt: skip
SOUP = st.lists(st.sampled_from(TOKENS), max_size=60).map("".join)
ANY_TEXT = st.one_of(st.text(), SOUP)


@pytest.mark.parametrize(("fn", "valid"), FUNCTIONS, ids=NAMES)
@settings(max_examples=200, deadline=None)
@given(completion=ANY_TEXT, answer=st.one_of(st.integers(-1000, 1000).map(str), st.sampled_from(["0.5", "3/4"])))
def test_no_function_raises_on_arbitrary_text_and_scores_stay_in_range(fn, valid, completion, answer):
    scores = fn(["prompt"], [completion], answer=[answer], numbers=[[1, 2, 3]], target=[6])
    assert_in_range(fn, valid, scores, 1)


@settings(max_examples=200, deadline=None)
@given(
    completion=ANY_TEXT,
    numbers=st.lists(st.integers(1, 100), min_size=1, max_size=5),
    target=st.integers(-100, 1000),
)
def test_countdown_never_raises_and_scores_one_of_its_three_values(completion, numbers, target):
    fn = countdown_reward(wrong_format_score=0.25)
    assert fn(["p"], [completion], numbers=[numbers], target=[target])[0] in (0.0, 0.25, 1.0)


@settings(max_examples=200, deadline=None)
@given(expression=st.lists(st.sampled_from([*"1234+-*/() "]), max_size=40).map("".join))
def test_countdown_scores_agree_with_the_parsed_value_and_literals(expression):
    # Whatever parses, scored against its own literals and value, is correct; off by one, it is wrong.
    parsed = evaluate_expression(expression)
    if parsed is None:
        return
    value, literals = parsed
    fn = countdown_reward(wrong_format_score=0.5)
    if value is not None and value.denominator == 1:
        assert fn(["p"], [expression], numbers=[literals], target=[int(value)]) == [1.0]
        assert fn(["p"], [expression], numbers=[literals], target=[int(value) + 1]) == [0.5]
    else:
        assert fn(["p"], [expression], numbers=[literals], target=[0]) == [0.5]
