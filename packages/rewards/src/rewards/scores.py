"""What reward functions return and how one result is checked: ``Scores``, ``RewardError``, and the
checks that name a bad score (its function, its completion, its row)."""

from __future__ import annotations

import math
import numbers
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

__all__ = ["ON_ERROR_CHOICES", "ROW_FIELD", "RewardError", "Scored", "Scores", "call_metrics", "is_list_like",
           "score_problem", "shorten"]

ON_ERROR_CHOICES = ("raise", "zero", "skip")
"""What a failed score (the call raised, hung past its timeout, returned the wrong count, a non-number or a
non-finite score) does. ``raise``: the call fails, naming the function, the row and the value. ``zero``:
it scores 0 and is counted (``rewards/failed``). ``skip``: it scores nothing (like ``None``: it adds
nothing to the total and is left out of the function's mean) and is counted (``rewards/failed``)."""

_SHOWN_CHARS = 80
ROW_FIELD = "source_row"
"""A field naming each row's origin (``file:line``); a failure names it when the rows carry it."""


def shorten(text: str, limit: int = _SHOWN_CHARS) -> str:
    """``repr`` of ``text`` cut to about ``limit`` characters, for error messages."""
    return repr(text if len(text) <= limit else text[: limit - 3] + "...")


class RewardError(ValueError):
    """A reward function failed: it raised, or returned the wrong count, a non-number or a non-finite score.

    Attributes: ``function`` (its name), ``index`` (the completion's index, or
    None when the whole call failed) and ``completion`` (that completion,
    shortened, as ``repr``; None when the whole call failed).
    """

    def __init__(self, message: str, *, function: str, index: int | None = None, completion: str | None = None) -> None:
        super().__init__(message)
        self.function = function
        self.index = index
        self.completion = completion


class Scores(list):
    """A reward function's scores (a list, one per completion) with numbers about the call.

    ``metrics`` are named like the step's metrics: ``time/<what>`` for seconds (e.g. a judge
    model's ``time/judge``), ``rewards/<name>/<what>`` for counts; the manager sums them over
    its functions into ``RewardResult.function_metrics``.
    """

    def __init__(self, scores: Sequence[float], metrics: Mapping[str, float] | None = None) -> None:
        super().__init__(scores)
        self.metrics: dict[str, float] = dict(metrics or {})


@dataclass(frozen=True)
class Scored:
    """One function's checked scores of a batch (None where it gave none) and its failures."""

    scores: tuple[float | None, ...]
    errors: tuple[RewardError, ...]
    num_failed: int
    metrics: Mapping[str, float] = field(default_factory=dict)


def call_metrics(name: str, raw: object) -> dict[str, float]:
    """The metrics a function returned with its ``Scores``: finite numbers under metric-like names."""
    metrics = getattr(raw, "metrics", None) if isinstance(raw, Scores) else None
    out: dict[str, float] = {}
    for key, value in (metrics or {}).items():
        if not isinstance(key, str) or not key.startswith(("time/", "rewards/")):
            raise RewardError(
                f"reward function {name!r} reported a metric named {key!r}; name them time/<what> or "
                "rewards/<name>/<what>", function=name,
            )
        if score_problem(value) is not None:
            raise RewardError(f"reward function {name!r} reported {key} = {value!r}, not a finite number",
                              function=name)
        out[key] = float(value)
    return out


def is_list_like(value: object) -> bool:
    """A list, tuple, numpy array...: sized and iterable, but not text or a mapping."""
    return isinstance(value, Collection) and not isinstance(value, (str, bytes, Mapping))


def score_problem(score: object) -> str | None:
    """What is wrong with one score, or None if it is a finite real number."""
    if isinstance(score, bool) or not isinstance(score, numbers.Real):
        return f"a non-number {repr(score)[:40]} ({type(score).__name__})"
    if not math.isfinite(score):
        return f"a non-finite score {float(score)!r}"
    return None
