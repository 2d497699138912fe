"""Number parsing: exact values, the forms accepted, and the caps."""

from fractions import Fraction

import pytest

from rewards.numbers import ANSWER_TAIL_CHARS, MAX_DIGITS, first_number, last_number, parse_number, reference_number


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("42", Fraction(42)),
        ("42.0", Fraction(42)),
        ("42.50", Fraction(85, 2)),
        ("1,000", Fraction(1000)),
        ("1,234,567.5", Fraction(2469135, 2)),
        ("+5", Fraction(5)),
        ("-0", Fraction(0)),
        ("\u22123", Fraction(-3)),  # Unicode minus
        (".5", Fraction(1, 2)),
        ("3/4", Fraction(3, 4)),
        (" -3 / 4 ", Fraction(-3, 4)),
        ("1.5/3", Fraction(1, 2)),
        ("1/0", None),  # no value
        ("1,00", None),  # a comma must group three digits
        ("1,0000", None),
        ("1e3", None),  # no exponents: 1e999999999 would build a huge int
        ("1_000", None),  # int() would accept this; we do not
        ("٤٢", None),  # non-ASCII digits
        ("", None),
        ("abc", None),
        ("4 2", None),
        ("9" * MAX_DIGITS, Fraction(int("9" * MAX_DIGITS))),
        ("9" * (MAX_DIGITS + 1), None),
        ("0." + "0" * (MAX_DIGITS - 1) + "1", None),  # 101 digits in all
    ],
)
def test_parse_number(text, expected):
    assert parse_number(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("So the answer is 42.", Fraction(42)),
        ("1, 2, then 3", Fraction(3)),
        ("total: $1,000", Fraction(1000)),
        ("x = -5", Fraction(-5)),
        ("10-5", Fraction(5)),  # a minus after a digit is subtraction, not a sign
        ("(2)-7", Fraction(7)),
        ("half is 1/2", Fraction(1, 2)),
        ("no numbers here", None),
        ("", None),
        ("1" * (MAX_DIGITS + 1), None),  # the last number is too long: no answer, not an earlier one
    ],
)
def test_last_number(text, expected):
    assert last_number(text) == expected


def test_last_number_reads_only_the_tail_and_drops_a_number_cut_by_it():
    assert last_number("7 " + "x" * ANSWER_TAIL_CHARS) is None
    # The tail starts inside "12345": reading "345" would invent a number.
    text = "12345" + "y" * (ANSWER_TAIL_CHARS - 3)
    assert last_number(text) is None
    # Exactly the tail: the whole number is read.
    assert last_number("12345 " + "y" * (ANSWER_TAIL_CHARS - 6)) == 12345


@pytest.mark.parametrize(
    ("text", "expected"),
    [(" 1,234", Fraction(1234)), (" $18.", Fraction(18)), ("The answer is -3 apples", Fraction(-3)), ("none", None)],
)
def test_first_number(text, expected):
    assert first_number(text) == expected


def test_first_number_does_not_read_the_start_of_a_number_that_runs_past_the_head():
    assert first_number(" " * 150 + "1" * 80) is None


@pytest.mark.parametrize(
    ("value", "expected"),
    [("1,000", Fraction(1000)), (7, Fraction(7)), (0.1, Fraction(1, 10)), (Fraction(3, 4), Fraction(3, 4))],
)
def test_reference_number(value, expected):
    assert reference_number(value, "answer", 0) == expected


@pytest.mark.parametrize("value", ["abc", True, None, float("nan"), [1]])
def test_reference_number_rejects_non_numbers_naming_the_field(value):
    with pytest.raises(ValueError, match=r"answer\[3\]"):
        reference_number(value, "answer", 3)


MINUS_FORMS = ["\u2212", "\ufe63", "\uff0d", "\u2796", "\u02d7"]  # minus sign, small, fullwidth, heavy, modifier
DASHES = ["\u2010", "\u2011", "\u2012", "\u2013", "\u2014"]  # hyphen, non-breaking hyphen, figure, en, em dash


@pytest.mark.parametrize("minus", MINUS_FORMS)
def test_every_unicode_minus_form_is_a_minus_sign(minus):
    assert parse_number(f"{minus}42") == -42
    assert parse_number(f" {minus}3/4 ") == Fraction(-3, 4)
    assert last_number(f"so x = {minus}42") == -42
    assert first_number(f"{minus}7 apples") == -7
    assert reference_number(f"{minus}42", "answer", 0) == -42
    # after a digit it is subtraction, as with "-": "10-5" ends in 5, not -5
    assert last_number(f"10{minus}5") == 5


@pytest.mark.parametrize("dash", DASHES)
def test_a_dash_in_sign_position_makes_the_number_unreadable(dash):
    # An en dash is often a typeset minus, a dash is often punctuation: neither 42 nor -42 is safe.
    assert parse_number(f"{dash}42") is None
    assert last_number(f"the answer is {dash}42") is None  # not an earlier number either
    assert last_number(f"7 then {dash}42") is None
    assert first_number(f"{dash}42 apples") is None
    with pytest.raises(ValueError, match=r"answer\[0\]"):
        reference_number(f"{dash}42", "answer", 0)
    # between numbers a dash separates them, like "-" after a digit: a range ends in its last number
    assert last_number(f"pages 10{dash}20") == 20
