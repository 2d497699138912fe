"""length_penalty: 0, then linear to -1 over buffer_chars, then -1 (characters)."""

import pytest

from rewards import length_penalty


@pytest.mark.parametrize(
    ("num_chars", "expected"),
    [
        (0, 0.0),
        (60, 0.0),  # max_chars - buffer_chars = 100 - 40 = 60: still free
        (70, -0.25),  # (60 - 70) / 40
        (90, -0.75),
        (100, -1.0),  # at max_chars: -1
        (101, -1.0),
        (10_000, -1.0),
    ],
)
def test_length_penalty(num_chars, expected):
    fn = length_penalty(max_chars=100, buffer_chars=40)
    assert fn.__name__ == "length_penalty"
    assert fn(["p"], ["x" * num_chars]) == [pytest.approx(expected, abs=1e-12)]


def test_counts_characters_not_bytes():
    # "é" is 2 bytes in UTF-8 and one character; 60 characters are still free.
    assert length_penalty(max_chars=100, buffer_chars=40)(["p"], ["é" * 60]) == [0.0]


def test_zero_buffer_is_a_step():
    fn = length_penalty(max_chars=10, buffer_chars=0)
    assert fn(["p"] * 2, ["x" * 10, "x" * 11]) == [0.0, -1.0]


@pytest.mark.parametrize(
    "kwargs", [{"max_chars": 0}, {"max_chars": -1}, {"max_chars": 10, "buffer_chars": 11}, {"max_chars": 1.5}]
)
def test_bad_parameters(kwargs):
    with pytest.raises(ValueError, match="chars"):
        length_penalty(**kwargs)
