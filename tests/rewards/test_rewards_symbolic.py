"""boxed_reward with symbolic equivalence: equal forms score 1, their non-equivalent neighbours 0.

Each pair is checked through `boxed_reward` (the completion boxes the first
form, the reference is the second) and both ways round.
"""

import pytest

from rewards import boxed_reward
from rewards.symbolic import MAX_SYMBOLIC_CHARS, symbolic_equal

EQUIVALENT = [
    (r"2\sqrt{2}", r"\sqrt{8}"),
    (r"2\sqrt2", r"\sqrt{8}"),
    ("x^2+2x", "2x+x^2"),
    ("x^2+2x", "x(x+2)"),
    (r"\{1,2\}", r"\{2,1\}"),
    ("{1,2}", "{2,1}"),
    ("1, 2", "2, 1"),
    (r"\text{(B)}", "B"),
    (r"\$5", "5"),
    (r"\$5.00", "5"),
    (r"\frac{\sqrt{2}}{2}", r"\frac{1}{\sqrt{2}}"),
    (r"\frac{\pi}{2}", r"\pi/2"),
    (r"\frac{x^2-1}{x-1}", "x+1"),
    (r"\sqrt[3]{27}", "3"),
    ("2^{10}", "1024"),
    (r"3x^2", "x^23"),  # LaTeX reads x^23 as x^2 3
    (r"\left(1,2\right)", "(1, 2)"),
    ("(x+1)^{2}", "x^2+2x+1"),  # within the degree budget
]
NEIGHBOURS = [
    (r"2\sqrt{3}", r"\sqrt{8}"),
    (r"3\sqrt{2}", r"\sqrt{8}"),
    ("x^2+2x", "2x+x^3"),
    ("x^2+2x", "x^2+2"),
    (r"\{1,2\}", r"\{1,3\}"),
    (r"\{1,2\}", r"\{1,2,3\}"),
    ("(1,2)", "(2,1)"),  # a point is ordered
    (r"\{1,2\}", "(1,2)"),
    (r"\text{(B)}", "C"),
    (r"\$5", "6"),
    (r"\$5", "50"),
    (r"\frac{\sqrt{2}}{2}", r"\frac{1}{2}"),
    (r"\frac{x^2-1}{x-1}", "x-1"),
    ("2^{10}", "1023"),
    (r"\pi", "3.14159"),  # close is not equal
]


def score(predicted: str, reference: str) -> float:
    return boxed_reward(["p"], [f"The answer is \\boxed{{{predicted}}}."], answer=[reference])[0]


@pytest.mark.parametrize(("a", "b"), EQUIVALENT, ids=[f"{a}=={b}" for a, b in EQUIVALENT])
def test_equivalent_answers_score_one(a, b):
    assert score(a, b) == 1.0
    assert score(b, a) == 1.0


@pytest.mark.parametrize(("a", "b"), NEIGHBOURS, ids=[f"{a}!={b}" for a, b in NEIGHBOURS])
def test_non_equivalent_neighbours_score_zero(a, b):
    assert score(a, b) == 0.0
    assert score(b, a) == 0.0


@pytest.mark.parametrize(
    "text",
    [
        "__import__('os').system('echo pwned')",  # never evaluated: not in the allow-list
        "Symbol('x')",
        r"\int_0^1 x\,dx",  # unsupported commands are refused, not guessed
        "x_1+x_2",
        "a+b+c+d",  # more than three variables
        "(" * 40 + "x" + ")" * 40,  # deeper than MAX_DEPTH
        "((2^{64})^{64})^{64}",  # would build a number of 262,144 bits
        "(x+1)^{30}",  # past the degree budget
        "9^{9^{9}}",
        "x" * (MAX_SYMBOLIC_CHARS + 1),
        r"\frac{1}{0}",
    ],
)
def test_refused_answers_are_never_shown_equal(text):
    assert symbolic_equal(text, text + "+1") is False
    assert symbolic_equal(text + "+1", text) is False
