"""Countdown: reach ``target`` from ``numbers`` with + - * / and parentheses.

The answer expression is parsed by a small recursive-descent parser over an
allow-list grammar and evaluated exactly with ``Fraction``; model text is
never evaluated, compiled or imported. Length and depth are bounded before
and during parsing, so hostile input costs at most a few hundred steps.

Grammar (whitespace between tokens is ignored)::

    expr   := term (("+" | "-") term)*
    term   := factor (("*" | "/") factor)*
    factor := INTEGER | "(" expr ")"

Policy, by design:

- no unary minus or plus: ``-3 + 5`` does not parse (negating is not one of
  the four operations, and it would let ``-`` change a given number);
- integer literals only: ``2.5`` does not parse;
- ``**``, ``//``, ``%``, ``=`` and any other character do not parse;
- intermediate results may be non-integers: ``(1 / 2) * 4`` is 2;
- division by zero anywhere makes the value undefined, so the answer is wrong
  (but well formed).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from fractions import Fraction

from rewards.formatting import check_tag_name, tag_content

__all__ = ["MAX_EXPRESSION_CHARS", "MAX_NESTING", "countdown_reward", "evaluate_expression"]

MAX_EXPRESSION_CHARS = 256
"""Longer answers are not parsed (a countdown answer uses a handful of numbers)."""

MAX_NESTING = 32
"""Deepest parenthesis nesting parsed; deeper does not parse."""

_MAX_LITERAL_DIGITS = 12
"""Longest integer literal; with the length cap, every value stays a few hundred digits at most."""

_OPERATORS = frozenset("+-*/()")


class _Malformed(Exception):
    """The expression is outside the grammar or the caps."""


def _tokenize(text: str) -> list[str]:
    tokens: list[str] = []
    i = 0
    while i < len(text):
        char = text[i]
        if char in " \t\r\n":
            i += 1
        elif char in _OPERATORS:
            tokens.append(char)
            i += 1
        elif "0" <= char <= "9":  # ASCII only: str.isdigit() accepts e.g. superscripts
            j = i
            while j < len(text) and "0" <= text[j] <= "9":
                j += 1
            if j - i > _MAX_LITERAL_DIGITS:
                raise _Malformed
            tokens.append(text[i:j])
            i = j
        else:
            raise _Malformed
    return tokens


class _Parser:
    """Parses and evaluates one token list; ``None`` as a value means undefined (a division by zero)."""

    def __init__(self, tokens: list[str]) -> None:
        self.tokens = tokens
        self.position = 0
        self.literals: list[int] = []

    def peek(self) -> str | None:
        return self.tokens[self.position] if self.position < len(self.tokens) else None

    def take(self) -> str:
        token = self.peek()
        if token is None:
            raise _Malformed
        self.position += 1
        return token

    def expr(self, depth: int) -> Fraction | None:
        value = self.term(depth)
        while self.peek() in ("+", "-"):
            operator = self.take()
            right = self.term(depth)
            if value is None or right is None:
                value = None
            else:
                value = value + right if operator == "+" else value - right
        return value

    def term(self, depth: int) -> Fraction | None:
        value = self.factor(depth)
        while self.peek() in ("*", "/"):
            operator = self.take()
            right = self.factor(depth)
            if value is None or right is None or (operator == "/" and right == 0):
                value = None
            else:
                value = value * right if operator == "*" else value / right
        return value

    def factor(self, depth: int) -> Fraction | None:
        token = self.take()
        if token == "(":
            if depth >= MAX_NESTING:
                raise _Malformed
            value = self.expr(depth + 1)
            if self.take() != ")":
                raise _Malformed
            return value
        if not token.isdigit():
            raise _Malformed
        self.literals.append(int(token))
        return Fraction(int(token))


def evaluate_expression(text: str) -> tuple[Fraction | None, list[int]] | None:
    """Parse ``text`` under the grammar above.

    Returns None when it does not parse; otherwise ``(value, literals)`` where
    value is the exact result (None if it divides by zero) and literals are
    the integers used, in order.
    """
    text = text.strip()
    if not text or len(text) > MAX_EXPRESSION_CHARS:
        return None
    try:
        parser = _Parser(_tokenize(text))
        value = parser.expr(0)
        if parser.peek() is not None:
            raise _Malformed
    except _Malformed:
        return None
    return value, parser.literals


def _answer_text(completion: str, tag: str) -> str:
    """The last ``<tag>...</tag>`` content if any, else the last non-empty line."""
    content = tag_content(completion, tag)
    if content is not None:
        return content
    stripped = completion.rstrip()
    return stripped[stripped.rfind("\n") + 1 :]


def countdown_reward(*, wrong_format_score: float = 0.1, answer_tag: str = "answer") -> Callable[..., list[float]]:
    """A Countdown reward named ``countdown``, over fields ``numbers`` (list of int lists) and ``target`` (ints).

    The answer is the content of the last ``<answer_tag>...</answer_tag>`` pair,
    or, without one, the completion's last non-empty line. It must be an
    expression under the module's grammar, nothing else (no ``= 24``).
    """
    valid = isinstance(wrong_format_score, (int, float)) and not isinstance(wrong_format_score, bool)
    if not (valid and 0.0 <= wrong_format_score <= 1.0):
        raise ValueError(f"wrong_format_score must be a number in [0, 1], got {wrong_format_score!r}")
    check_tag_name(answer_tag, "answer_tag")
    wrong_score = float(wrong_format_score)

    def countdown(
        prompts: Sequence[str],
        completions: Sequence[str],
        *,
        numbers: Sequence[Sequence[int]],
        target: Sequence[int],
        **_: object,
    ) -> list[float]:
        """Scores in {0.0, wrong_format_score, 1.0}.

        1.0: the expression uses exactly ``numbers`` (as a multiset, each once)
        and equals ``target``. ``wrong_format_score``: it parses but its value
        or its numbers are wrong, or it divides by zero. 0.0: no parsable
        expression.
        """
        for field, values in (("numbers", numbers), ("target", target)):
            if len(values) != len(completions):
                raise ValueError(f"{field} has {len(values)} entries for {len(completions)} completions")
        scores = []
        for i, completion in enumerate(completions):
            given, goal = _check_task(numbers[i], target[i], i)
            parsed = evaluate_expression(_answer_text(completion, answer_tag))
            if parsed is None:
                scores.append(0.0)
                continue
            value, literals = parsed
            correct = value is not None and value == goal and Counter(literals) == given
            scores.append(1.0 if correct else wrong_score)
        return scores

    return countdown


def _check_task(numbers: Sequence[int], target: int, index: int) -> tuple[Counter[int], int]:
    """The task's numbers as a multiset, and its target; raises naming the field on bad data."""
    if isinstance(numbers, (str, bytes)) or not all(isinstance(n, int) and not isinstance(n, bool) for n in numbers):
        raise ValueError(f"numbers[{index}] = {numbers!r} is not a list of ints")
    if not isinstance(target, int) or isinstance(target, bool):
        raise ValueError(f"target[{index}] = {target!r} is not an int")
    return Counter(numbers), target

