"""``\\boxed{...}`` answers: extraction with a bounded brace scan, and light LaTeX normalising.

Two answers are equal when both read as the same exact number (integers,
decimals, ``a/b``, ``\\frac{a}{b}``), or their normalised strings are equal,
or else when `rewards.symbolic` shows them equal (``2\\sqrt{2}`` == ``\\sqrt{8}``,
``\\{1,2\\}`` == ``\\{2,1\\}``), under its own bounds on size and time.
"""

from __future__ import annotations

import re
from fractions import Fraction

from rewards.numbers import parse_number
from rewards.symbolic import symbolic_equal

__all__ = ["MAX_BOXED_CHARS", "answers_equal", "last_boxed", "latex_number", "normalize_answer"]

MAX_BOXED_CHARS = 1_000
"""Longest ``\\boxed{...}`` content read; an answer whose braces do not close within it is no answer."""

_BOXED = "\\boxed"
# Content without braces, so these cannot backtrack beyond one pass.
_TEXT_WRAPPER = re.compile(r"\\(?:text|textbf|textrm|textnormal|mathrm|mathbf|mbox)\{([^{}]*)\}")
_SIZED_DELIMITER = re.compile(r"\\(?:left|right)(?![A-Za-z])")
_SPACING = re.compile(r"\\[!,;: ]|\\quad|\\qquad|\s+")
_UNITS_SUFFIX = re.compile(r"(?:\^\{?\\circ\}?|\\%|%|\.)$")
_VARIABLE_PREFIX = re.compile(r"^[A-Za-z]=(?=.)")
_CHOICE = re.compile(r"\(([A-Z])\)")  # a multiple-choice letter written (B)
_FRAC = re.compile(r"([-+]?)\\frac(?:\{([^{}]*)\}\{([^{}]*)\}|([0-9])([0-9]))")


def last_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` in ``text`` (balanced braces), or None.

    Only the last ``\\boxed`` counts; if its braces do not balance within
    ``MAX_BOXED_CHARS`` characters there is no answer. A counter, not
    recursion, tracks nesting, so depth costs nothing.
    """
    start = text.rfind(_BOXED)
    if start < 0:
        return None
    rest = text[start + len(_BOXED) : start + len(_BOXED) + MAX_BOXED_CHARS + 2].lstrip(" ")
    if not rest.startswith("{"):
        return None
    depth = 0
    for i, char in enumerate(rest):
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return rest[1:i]
    return None


def normalize_answer(answer: str) -> str:
    """A canonical string for comparing answers.

    Strips ``$``, whitespace and LaTeX spacing (``\\!``, ``\\,``...), ``\\left``/``\\right``,
    ``\\text{}``-like wrappers, a trailing degree sign, percent sign or full stop,
    and a leading ``x=``; spells ``\\dfrac``/``\\tfrac`` as ``\\frac`` and ``{,}`` as ``,``.
    """
    answer = answer[: 2 * MAX_BOXED_CHARS]
    answer = _TEXT_WRAPPER.sub(r"\1", answer)
    answer = answer.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    answer = _SIZED_DELIMITER.sub("", answer)
    answer = _SPACING.sub("", answer).replace("\\$", "").replace("$", "").replace("{,}", ",")
    answer = _UNITS_SUFFIX.sub("", answer)
    answer = _VARIABLE_PREFIX.sub("", answer)
    if len(answer) > 2 and answer[0] == "{" and answer[-1] == "}" and "{" not in answer[1:-1]:
        answer = answer[1:-1]
    return _CHOICE.sub(r"\1", answer) if _CHOICE.fullmatch(answer) else answer


def latex_number(answer: str) -> Fraction | None:
    """The exact value of a normalised answer that is a plain number or ``\\frac``, else None."""
    match = _FRAC.fullmatch(answer)
    if match is None:
        return parse_number(answer)
    sign, num_text, den_text, num_digit, den_digit = match.groups()
    num = parse_number(num_text if num_digit is None else num_digit)
    den = parse_number(den_text if den_digit is None else den_digit)
    if num is None or den is None or den == 0:
        return None
    value = num / den
    return -value if sign == "-" else value


def answers_equal(predicted: str, reference: str) -> bool:
    """Whether two raw answers agree: as exact numbers when both are numbers, else as strings,
    else symbolically."""
    raw_predicted, raw_reference = predicted, reference
    predicted, reference = normalize_answer(predicted), normalize_answer(reference)
    predicted_value, reference_value = latex_number(predicted), latex_number(reference)
    if predicted_value is not None and reference_value is not None:
        return predicted_value == reference_value
    if predicted != "" and predicted == reference:
        return True
    return symbolic_equal(raw_predicted, raw_reference)
