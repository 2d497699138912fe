"""Symbolic equivalence of short LaTeX answers (``2\\sqrt{2}`` == ``\\sqrt{8}``, ``x^2+2x`` == ``2x+x^2``).

Model text is never evaluated: an allow-list recursive-descent parser turns an
answer into sympy objects built directly (``Integer``, ``Symbol``, ``Add``,
``Mul``, ``Pow``), never through ``sympify``/``parse_expr`` (which call
``eval``). Every call is bounded before sympy sees anything:

- answers longer than ``MAX_SYMBOLIC_CHARS`` are not compared symbolically;
- numbers have at most ``MAX_NUMBER_CHARS`` characters; nesting is at most ``MAX_DEPTH``;
- a power of two numbers needs a small exponent and a base of at most
  ``MAX_POWER_BITS`` bits, and powers of expressions have a total degree budget,
  so no huge integer or polynomial is ever built;
- only single-letter variables, at most three of them; only ``\\frac``,
  ``\\sqrt``, ``\\pi``, ``\\infty`` and the multiplication/division commands;
- any failure (an unknown token, a sympy error) means "not shown equal": 0, never a crash.

Comma lists compare as sets when written as ``\\{...\\}``, ``{...}`` or bare
(MATH's "all solutions" answers), as ordered tuples inside parentheses or brackets.
"""

from __future__ import annotations

import functools
import re
from typing import Any

__all__ = ["MAX_SYMBOLIC_CHARS", "symbolic_equal"]

MAX_SYMBOLIC_CHARS = 200
"""Longest answer (after light cleaning) compared symbolically."""
MAX_NUMBER_CHARS = 40
MAX_DEPTH = 30
MAX_ELEMENTS = 10
"""Most elements of a set or tuple answer."""
MAX_NUMERIC_EXPONENT = 64
MAX_POWER_BITS = 2_048
MAX_DEGREE_BUDGET = 24
"""Sum of the integer exponents of non-numeric powers: (x+1)^24 is fine, (x+y+z)^200 is not built."""
MAX_SYMBOLS = 3

_CLEAN = (
    (re.compile(r"\\(?:text|textbf|textrm|textnormal|mathrm|mathbf|mbox)\{([^{}]*)\}"), r"\1"),
    (re.compile(r"\\(?:left|right)(?![A-Za-z])"), ""),
    (re.compile(r"\\[!,;: ]|\\quad|\\qquad|\s+"), ""),
    (re.compile(r"\\\$|\$"), ""),
    (re.compile(r"\\[dt]frac(?![A-Za-z])"), r"\\frac"),
)
_TOKEN = re.compile(r"\\\{|\\\}|\\[A-Za-z]+|\d+\.?\d*|\.\d+|[A-Za-z]|[-+*/^(){}\[\],]")
_THOUSANDS = re.compile(r"\d{1,3}(?:,\d{3})+")
_COMMANDS = {"frac", "sqrt", "pi", "infty", "cdot", "times", "div"}


class _Refused(Exception):
    """The answer is outside what is compared symbolically."""


def symbolic_equal(predicted: str, reference: str) -> bool:
    """True when both answers parse and are shown equal; False otherwise (never raises)."""
    if not isinstance(predicted, str) or not isinstance(reference, str):
        return False
    a, b = _clean(predicted), _clean(reference)
    if not a or not b or len(a) > MAX_SYMBOLIC_CHARS or len(b) > MAX_SYMBOLIC_CHARS:
        return False
    return _equal_cached(a, b)


def _clean(text: str) -> str:
    text = text[: 4 * MAX_SYMBOLIC_CHARS]
    for pattern, replacement in _CLEAN:
        text = pattern.sub(replacement, text)
    return text


@functools.lru_cache(maxsize=4_096)
def _equal_cached(a: str, b: str) -> bool:
    try:
        return _same(_parse_answer(a), _parse_answer(b))
    except Exception:  # noqa: BLE001 - a parse refusal or any sympy error: not shown equal
        return False


# -- answers: one expression, a set or a tuple --------------------------------------------------------


def _parse_answer(text: str) -> tuple[str, Any]:
    """("expr", e), ("set", [e...]) or ("tuple", [e...])."""
    if text.startswith("\\{") and text.endswith("\\}"):
        return "set", _parse_list(text[2:-2])
    if _THOUSANDS.fullmatch(text):
        return "expr", _Parser(text.replace(",", "")).parse()
    if text[0] + text[-1] in ("{}", "()", "[]") and _top_level_comma(text[1:-1]):
        return ("set" if text[0] == "{" else "tuple"), _parse_list(text[1:-1])
    if _top_level_comma(text):
        return "set", _parse_list(text)
    return "expr", _Parser(text).parse()


def _top_level_comma(text: str) -> bool:
    depth = 0
    for char in text:
        depth += char in "({["
        depth -= char in ")}]"
        if char == "," and depth == 0:
            return True
    return False


def _parse_list(text: str) -> list[Any]:
    parts, depth, start = [], 0, 0
    for i, char in enumerate(text):
        depth += char in "({["
        depth -= char in ")}]"
        if char == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    if len(parts) > MAX_ELEMENTS or any(not p for p in parts):
        raise _Refused("too many or empty elements")
    return [_Parser(p).parse() for p in parts]


def _same(a: tuple[str, Any], b: tuple[str, Any]) -> bool:
    (kind_a, x), (kind_b, y) = a, b
    if kind_a != kind_b:
        return False
    if kind_a == "expr":
        return _equal_expr(x, y)
    if len(x) != len(y):
        return False
    if kind_a == "tuple":
        return all(_equal_expr(p, q) for p, q in zip(x, y))
    unmatched = list(y)
    for p in x:
        match = next((i for i, q in enumerate(unmatched) if _equal_expr(p, q)), None)
        if match is None:
            return False
        unmatched.pop(match)
    return True


def _equal_expr(a: Any, b: Any) -> bool:
    import sympy

    if a == b:
        return True
    if a.has(sympy.oo, -sympy.oo, sympy.zoo) or b.has(sympy.oo, -sympy.oo, sympy.zoo):
        return False
    difference = a - b
    if difference == 0:
        return True
    if not difference.free_symbols:  # a constant: 30 significant digits decide
        value = difference.evalf(30)
        return value.is_number and abs(value) < sympy.Float("1e-25")
    return sympy.expand(difference) == 0 or sympy.cancel(difference) == 0


# -- one expression ------------------------------------------------------------------------------------


class _Parser:
    """Recursive descent over an allow-list of tokens; builds sympy objects directly."""

    def __init__(self, text: str) -> None:
        self.tokens = _TOKEN.findall(text)
        if "".join(self.tokens) != text:
            raise _Refused(f"characters outside the allow-list in {text!r}")
        self.pos = 0
        self.depth = 0
        self.degree = 0
        self.symbols: set[str] = set()

    def parse(self) -> Any:
        if not self.tokens:
            raise _Refused("empty")
        value = self.expr()
        if self.pos != len(self.tokens):
            raise _Refused(f"unexpected {self.peek()!r}")
        return value

    def peek(self) -> str | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self, expected: str | None = None) -> str:
        token = self.peek()
        if token is None or (expected is not None and token != expected):
            raise _Refused(f"expected {expected!r}, got {token!r}")
        self.pos += 1
        return token

    def nested(self, parse):
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise _Refused("nested too deeply")
        try:
            return parse()
        finally:
            self.depth -= 1

    def expr(self) -> Any:
        value = self.term()
        while self.peek() in ("+", "-"):
            op = self.take()
            rhs = self.term()
            value = value + rhs if op == "+" else value - rhs
        return value

    def term(self) -> Any:
        value = self.unary()
        while True:
            token = self.peek()
            if token in ("*", "\\cdot", "\\times"):
                self.take()
                value = value * self.unary()
            elif token in ("/", "\\div"):
                self.take()
                value = value / self.unary()
            elif token is not None and self.starts_primary(token):
                value = value * self.power()  # implicit multiplication: 2x, 2\sqrt{2}, x(x+1)
            else:
                return value

    def starts_primary(self, token: str) -> bool:
        return token[0].isdigit() or token[0] == "." or token.isalpha() or token in ("(", "{", "[") or (
            token.startswith("\\") and token[1:] in ("frac", "sqrt", "pi", "infty")
        )

    def unary(self) -> Any:
        if self.peek() == "-":
            self.take()
            return -self.nested(self.unary)
        if self.peek() == "+":
            self.take()
            return self.nested(self.unary)
        return self.power()

    def power(self) -> Any:
        base = self.primary()
        if self.peek() != "^":
            return base
        self.take()
        return _power(base, self.exponent(), self)

    def exponent(self) -> Any:
        token = self.peek()
        if token is not None and token[0].isdigit() and len(token) > 1 and "{" != token:
            # x^23 in LaTeX is x^2 * 3: the exponent is one character
            self.tokens[self.pos] = token[1:]
            return _number(token[0])
        if token == "-":
            self.take()
            return -self.nested(self.primary)
        return self.nested(self.primary)

    def group(self) -> Any:
        """{...} as one argument, or a single token (\\frac12, \\sqrt2)."""
        if self.peek() == "{":
            return self.nested(self.braced)
        token = self.peek()
        if token is not None and token[0].isdigit() and len(token) > 1:
            self.tokens[self.pos] = token[1:]
            return _number(token[0])
        return self.nested(self.primary)

    def braced(self) -> Any:
        self.take("{")
        value = self.expr()
        self.take("}")
        return value

    def primary(self) -> Any:
        import sympy

        token = self.take()
        if token[0].isdigit() or token[0] == ".":
            return _number(token)
        if token.isalpha():
            self.symbols.add(token)
            if len(self.symbols) > MAX_SYMBOLS:
                raise _Refused("too many variables")
            return sympy.Symbol(token)
        if token in ("(", "[", "{"):
            close = {"(": ")", "[": "]", "{": "}"}[token]
            value = self.nested(self.expr)
            self.take(close)
            return value
        if token.startswith("\\") and token[1:] in _COMMANDS:
            name = token[1:]
            if name == "pi":
                return sympy.pi
            if name == "infty":
                return sympy.oo
            if name == "frac":
                numerator = self.group()
                denominator = self.group()
                if denominator == 0:
                    raise _Refused("division by zero")
                return numerator / denominator
            if name == "sqrt":
                if self.peek() == "[":
                    self.take("[")
                    index = self.nested(self.expr)
                    self.take("]")
                    return _power(self.group(), 1 / index, self)
                return _power(self.group(), sympy.Rational(1, 2), self)
        raise _Refused(f"token {token!r} is not compared symbolically")


def _number(text: str) -> Any:
    import sympy

    if len(text) > MAX_NUMBER_CHARS:
        raise _Refused("number too long")
    if "." in text:
        whole, _, decimals = text.partition(".")
        return sympy.Rational(int(whole or "0") * 10 ** len(decimals) + int(decimals or "0"), 10 ** len(decimals))
    return sympy.Integer(int(text))


def _power(base: Any, exponent: Any, parser: _Parser) -> Any:
    """base ** exponent, refused when it would build a huge number or polynomial."""
    import sympy

    if not exponent.is_Rational:
        if exponent.free_symbols or base.free_symbols:
            return sympy.Pow(base, exponent)  # symbolic exponents: expand keeps them as they are
        raise _Refused("irrational numeric exponent")
    if abs(exponent.p) > MAX_NUMERIC_EXPONENT or exponent.q > MAX_NUMERIC_EXPONENT:
        raise _Refused("exponent too large")
    if base.is_Rational:
        if max(abs(base.p).bit_length(), base.q.bit_length()) > MAX_POWER_BITS:
            raise _Refused("base too large")
        if base == 0 and exponent < 0:
            raise _Refused("division by zero")
    elif exponent.is_Integer:  # a power of an expression: counts against the degree budget
        parser.degree += abs(int(exponent))
        if parser.degree > MAX_DEGREE_BUDGET:
            raise _Refused("degree too large")
    return sympy.Pow(base, exponent)
