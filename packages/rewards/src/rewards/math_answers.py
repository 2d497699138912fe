"""Reward functions for math answers checked against a reference (field ``answer``).

All three score 1.0 for a correct final answer and 0.0 otherwise. A reference
that is not an answer (e.g. ``answer=["abc"]`` for a numeric task) raises
ValueError naming ``answer[i]``: bad data should stop a run, not score 0 forever.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from fractions import Fraction

from rewards.formatting import check_tag_name, tag_content
from rewards.latex import answers_equal, last_boxed
from rewards.numbers import first_number, last_number, reference_number

__all__ = ["boxed_reward", "gsm8k_reward", "numeric_answer", "numeric_answer_reward"]

_GSM8K_MARK = "####"


def _check_lengths(completions: Sequence[str], answer: Sequence[object]) -> None:
    if len(answer) != len(completions):
        raise ValueError(f"answer has {len(answer)} entries for {len(completions)} completions")


def numeric_answer_reward(*, answer_tag: bool = False, tag: str = "answer") -> Callable[..., list[float]]:
    """A reward comparing the completion's final number with field ``answer``, exactly.

    With ``answer_tag=False`` the final number is the last number in the
    completion (searched in its last ``ANSWER_TAIL_CHARS`` characters); with
    ``answer_tag=True`` it is the last number inside the last ``<tag>...</tag>``
    pair, and a completion without that pair scores 0. The returned function
    is named ``numeric_answer`` or ``numeric_answer_tag``.
    """
    check_tag_name(tag, "tag")

    def numeric_answer(
        prompts: Sequence[str], completions: Sequence[str], *, answer: Sequence[object], **_: object
    ) -> list[float]:
        """1.0 if the completion's final number equals ``answer`` exactly, else 0.0.

        Numbers compare as exact fractions: ``1,000`` == ``1000``, ``42.50`` ==
        ``42.5``, ``+5`` == ``5``, ``-0`` == ``0``, ``3/4`` == ``0.75``.
        """
        _check_lengths(completions, answer)
        scores = []
        for i, (completion, reference) in enumerate(zip(completions, answer)):
            expected = reference_number(reference, "answer", i)
            text = tag_content(completion, tag) if answer_tag else completion
            found = None if text is None else last_number(text)
            scores.append(1.0 if found is not None and found == expected else 0.0)
        return scores

    numeric_answer.__name__ = "numeric_answer_tag" if answer_tag else "numeric_answer"
    return numeric_answer


numeric_answer = numeric_answer_reward()


def _gsm8k_number(text: str) -> Fraction | None:
    """The first number after the last ``####`` in ``text``, or None without a ``####``."""
    mark = text.rfind(_GSM8K_MARK)
    return None if mark < 0 else first_number(text[mark + len(_GSM8K_MARK) :])


def gsm8k_reward(
    prompts: Sequence[str], completions: Sequence[str], *, answer: Sequence[object], **_: object
) -> list[float]:
    """1.0 if the number after the completion's last ``####`` equals ``answer``, else 0.0.

    The reference may be a bare number (``"1234"``, ``1234``) or a whole GSM8K
    solution ending in ``#### 1,234``. Numbers compare exactly, as in
    ``numeric_answer``. A completion without ``####`` scores 0.
    """
    _check_lengths(completions, answer)
    scores = []
    for i, (completion, reference) in enumerate(zip(completions, answer)):
        if isinstance(reference, str) and _GSM8K_MARK in reference:
            expected = _gsm8k_number(reference)
            if expected is None:
                raise ValueError(f"answer[{i}] = {reference!r} has no number after its last '####'")
        else:
            expected = reference_number(reference, "answer", i)
        found = _gsm8k_number(completion)
        scores.append(1.0 if found is not None and found == expected else 0.0)
    return scores


gsm8k_reward.__name__ = "gsm8k"  # the registry and metrics name; __qualname__ keeps pickling by reference


def boxed_reward(
    prompts: Sequence[str], completions: Sequence[str], *, answer: Sequence[object], **_: object
) -> list[float]:
    """1.0 if the completion's last ``\\boxed{...}`` matches ``answer``, else 0.0.

    Numbers compare exactly across forms (``\\frac{1}{2}`` == ``\\dfrac12`` ==
    ``0.5`` == ``1/2``); anything else compares as a normalised string (see
    ``rewards.latex.normalize_answer``). A reference containing ``\\boxed{}``
    (a whole MATH solution) is reduced to its last boxed content first.
    A completion without a closed ``\\boxed{...}`` scores 0.
    """
    _check_lengths(completions, answer)
    scores = []
    for i, (completion, reference) in enumerate(zip(completions, answer)):
        if not isinstance(reference, (str, int, Fraction)) or isinstance(reference, bool):
            raise ValueError(f"answer[{i}] = {reference!r} is not a str or int")
        reference = str(reference)
        reference = last_boxed(reference) or reference
        found = last_boxed(completion)
        scores.append(1.0 if found is not None and answers_equal(found, reference) else 0.0)
    return scores


boxed_reward.__name__ = "boxed"
