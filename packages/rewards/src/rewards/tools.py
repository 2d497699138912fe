"""Tools for multi-turn episodes, safe by construction.

`calculator` evaluates an arithmetic expression with the countdown reward's
allow-list parser (integers, + - * /, parentheses; rewards.countdown): nothing
is evaluated, compiled or imported, the input is capped at
``MAX_EXPRESSION_CHARS`` characters, nesting at ``MAX_NESTING`` and literals at 12
digits, so its time is bounded, and the answer is at most
``MAX_RESULT_DIGITS`` digits or an error line.
"""

from __future__ import annotations

from rewards.countdown import MAX_EXPRESSION_CHARS, evaluate_expression

__all__ = ["MAX_RESULT_DIGITS", "calculator"]

MAX_RESULT_DIGITS = 40
"""Longest result (digits of numerator and denominator together); longer is an error."""


def calculator(expression: str) -> str:
    """The exact value of `expression` (an integer, or a reduced fraction p/q), or `error: ...`."""
    if not isinstance(expression, str):
        return "error: the expression must be text"
    if len(expression) > MAX_EXPRESSION_CHARS:
        return f"error: longer than {MAX_EXPRESSION_CHARS} characters"
    parsed = evaluate_expression(expression)
    if parsed is None:
        return "error: not an arithmetic expression (integers, + - * / and parentheses)"
    value, _ = parsed
    if value is None:
        return "error: division by zero"
    # the digit count is checked on bit lengths first: no huge decimal string is ever built
    if max(abs(value.numerator).bit_length(), value.denominator.bit_length()) > 4 * MAX_RESULT_DIGITS:
        return "error: result too large"
    text = str(value.numerator) if value.denominator == 1 else f"{value.numerator}/{value.denominator}"
    if sum(c.isdigit() for c in text) > MAX_RESULT_DIGITS:
        return "error: result too large"
    return text
