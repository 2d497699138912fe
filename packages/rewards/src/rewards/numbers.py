"""Numbers in untrusted text: found and parsed exactly (``Fraction``), in bounded time.

Accepted forms: optional sign (``+``, ``-``, or a Unicode minus form), digits with
optional comma thousands separators in groups of three (``1,000``), an optional
decimal part (``42.50``, ``.5``), and simple fractions of two such numbers
(``3/4``). No exponents: ``1e999999999`` would build a huge integer.

Signs. Every Unicode minus form reads as ``-``: U+2212 MINUS SIGN, U+FE63 SMALL
HYPHEN-MINUS, U+FF0D FULLWIDTH HYPHEN-MINUS, U+2796 HEAVY MINUS SIGN and U+02D7
MODIFIER LETTER MINUS SIGN (``－42`` is -42, never 42). The hyphens and dashes
U+2010..U+2014 (hyphen, non-breaking hyphen, figure dash, en dash, em dash) are
ambiguous where a sign would stand: typesetting uses the en dash as a minus,
prose uses dashes as punctuation. A number directly after one of them (``–42``)
is unreadable, as if it were not there, so it is never scored as either sign;
after a digit or a closing bracket they separate, like ``-``: ``10–20`` ends in 20.

Every number is capped at ``MAX_DIGITS`` digits before any ``int()`` call, so
nothing here gets near Python's 4300-digit ``int`` limit or builds a big number.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction

__all__ = [
    "ANSWER_TAIL_CHARS",
    "MAX_DIGITS",
    "first_number",
    "last_number",
    "parse_number",
    "reference_number",
]

MAX_DIGITS = 100
"""Most digits (integer and decimal parts together) one number may have; longer is not a number."""

ANSWER_TAIL_CHARS = 2_000
"""Only this many final characters of a text are searched for its last number."""

_HEAD_CHARS = 200
"""Only this many first characters of a text are searched for its first number."""

_MAX_NUMBER_CHARS = 4 * MAX_DIGITS
"""Longer strings cannot be a number within the digit cap (digits, commas, sign, slash)."""

_MINUSES = "-\u2212\ufe63\uff0d\u2796\u02d7"
"""ASCII hyphen-minus and the Unicode minus forms: each reads as a minus sign."""
_DASHES = "\u2010\u2011\u2012\u2013\u2014"
"""Hyphens and dashes: in sign position they make the number unreadable (see the module docs)."""
_SIGNS = "+" + _MINUSES + _DASHES
_SIGN_CLASS = "[" + re.escape(_SIGNS) + "]"  # escaped: "+-\u2212" would be a range

# Fixed-width comma groups and a negative lookahead keep backtracking linear.
_DECIMAL = r"(?:(?:[0-9]{1,3}(?:,[0-9]{3})+(?![0-9])|[0-9]+)(?:\.[0-9]+)?|\.[0-9]+)"
# A sign counts only where it cannot be a binary minus ("10-5" is 10 and 5).
_SIGN = rf"(?:(?<![\w)\]}}]){_SIGN_CLASS})?"
_NUMBER = re.compile(rf"{_SIGN}{_DECIMAL}(?:[ \t]*/[ \t]*{_DECIMAL})?")
_STANDALONE_NUMBER = re.compile(rf"{_SIGN_CLASS}?{_DECIMAL}(?:[ \t]*/[ \t]*{_DECIMAL})?")
_NUMBER_CHARS = frozenset("0123456789,.")


def _decimal(text: str) -> Fraction | None:
    """An unsigned decimal already matched by ``_DECIMAL``, or None past the digit cap."""
    whole, _, frac = text.replace(",", "").partition(".")
    if len(whole) + len(frac) > MAX_DIGITS:
        return None
    return Fraction(int(whole + frac or "0"), 10 ** len(frac))


def _to_fraction(text: str) -> Fraction | None:
    """A string matched by ``_NUMBER``: sign, decimal, optional ``/ decimal``; None after a dash."""
    if text[0] in _DASHES:
        return None  # en dash as minus or dash as punctuation: neither reading is safe
    negative = text[0] in _MINUSES
    if text[0] in _SIGNS:
        text = text[1:]
    num_text, slash, den_text = text.partition("/")
    num = _decimal(num_text.strip())
    if num is None:
        return None
    if slash:
        den = _decimal(den_text.strip())
        if den is None or den == 0:
            return None
        num /= den
    return -num if negative else num


def parse_number(text: str) -> Fraction | None:
    """The exact value of ``text`` if the whole of it (spaces aside) is one number, else None.

    >>> parse_number("1,000") == parse_number("1000.0") == 1000
    True
    >>> parse_number("3/4") == parse_number("0.75")
    True
    """
    text = text.strip()
    if len(text) > _MAX_NUMBER_CHARS:
        return None
    match = _STANDALONE_NUMBER.fullmatch(text)
    return None if match is None else _to_fraction(match.group())


def last_number(text: str) -> Fraction | None:
    """The last number in the final ``ANSWER_TAIL_CHARS`` characters of ``text``, or None.

    A number cut by the tail's start is dropped rather than read as its last
    digits, and a last number longer than ``MAX_DIGITS`` gives None (not the
    number before it).
    """
    tail = text[-ANSWER_TAIL_CHARS:]
    if len(text) > len(tail) and text[-len(tail) - 1] in _NUMBER_CHARS:
        tail = tail.lstrip("0123456789,.")
    last = None
    for last in _NUMBER.finditer(tail):
        pass
    return None if last is None else _to_fraction(last.group())


def first_number(text: str) -> Fraction | None:
    """The first number in the first few hundred characters of ``text``, or None."""
    head = text[:_HEAD_CHARS]
    match = _NUMBER.search(head)
    if match is None:
        return None
    if match.end() == len(head) < len(text) and text[len(head)] in _NUMBER_CHARS:
        return None  # the number runs past the head; we would read only its start
    return _to_fraction(match.group())


def reference_number(value: object, field: str, index: int) -> Fraction:
    """A trusted reference answer (str, int, float or Fraction) as an exact Fraction.

    Raises ValueError naming ``field[index]`` when it is not a number: a bad
    reference is a data bug and should stop the run, not score 0 forever.
    """
    if isinstance(value, bool):
        pass  # True is an int, but never a reference answer
    elif isinstance(value, (int, Fraction)):
        return Fraction(value)
    elif isinstance(value, float) and math.isfinite(value):
        return Fraction(repr(value))  # repr keeps 0.1 as 1/10, not the binary double
    elif isinstance(value, str):
        number = parse_number(value)
        if number is not None:
            return number
    raise ValueError(f"{field}[{index}] = {value!r} is not a number")
