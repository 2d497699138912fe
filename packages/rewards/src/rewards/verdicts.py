"""Verdicts: the rules that turn a judge's reply (text) into a score in [0, 1].

Shared by every judge reward (a remote chat-completions judge, a local judge
model). A rule is a frozen, validated value, called on the reply's text; it
returns a float in [0, 1], or None when the reply holds no valid verdict. What
None costs (a fallback score, a skipped group, a stopped run) is the caller's
failure policy, not the rule's: a judge that rambles is not scored 0 silently.

Rules, by name in ``VERDICT_RULES``:

- ``number``: a score in ``[low, high]`` (``"Score: 7"``, ``"7/10"``),
  normalised to ``(x - low) / (high - low)``. Out of range: ``reject`` (None)
  or ``clip``.
- ``yes_no``: ``yes`` -> 1, ``no`` -> 0 (whole words, any case).
- ``rubric``: lines ``criterion: points`` or ``criterion: points/max``
  summed and divided by the summed maxima (G-Eval-style checklists,
  arXiv:2303.16634; Prometheus rubrics, arXiv:2310.08491).

Replies are untrusted text: only a bounded window is searched, numbers have
bounded digits, and every pattern runs in linear time.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from rewards.names import lookup

__all__ = [
    "MAX_VERDICT_CHARS",
    "VERDICT_RULES",
    "NumberVerdict",
    "RubricVerdict",
    "VerdictRule",
    "YesNoVerdict",
    "make_verdict_rule",
    "yes_probability",
]

MAX_VERDICT_CHARS = 4_000
"""Only this many characters of a reply are searched: the last ones, or the first for ``which="first"``."""

_MAX_RUBRIC_LINES = 200
"""A rubric longer than this is not read past its first lines."""

_OUT_OF_RANGE = ("reject", "clip")
_WHICH = ("last", "first")

# At most 15 digits on either side of the point; the lookarounds stop a longer run
# of digits (or a word like "v2") from matching in part.
_NUM = r"[-+]?(?<![\w.])\d{1,15}(?:\.\d{1,15})?(?![\d])"
_SCORE = re.compile(rf"(?P<x>{_NUM})(?:[ \t]*(?:/|out of)[ \t]*(?P<of>{_NUM}))?", re.IGNORECASE)
_RUBRIC_LINE = re.compile(
    rf"^[ \t]*(?:[-*+•][ \t]*|\d{{1,3}}[.)][ \t]+)?(?P<name>[^:=\n]{{1,200}}?)[ \t]*[:=][ \t]*"
    rf"(?P<points>{_NUM})(?:[ \t]*/[ \t]*(?P<of>{_NUM}))?"
)


def _window(text: str, which: str) -> str:
    return text[:MAX_VERDICT_CHARS] if which == "first" else text[-MAX_VERDICT_CHARS:]


def _check_choice(value: object, choices: tuple[str, ...], what: str) -> None:
    if value not in choices:
        raise ValueError(f"{what} must be one of {choices}, got {value!r}")


def _check_real(value: object, what: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{what} must be a finite number, got {value!r}")


@dataclass(frozen=True, kw_only=True)
class NumberVerdict:
    """A number in ``[low, high]``, normalised to [0, 1].

    The ``which`` number of the reply (``last``: judges reason first, then
    score) counts; with ``label`` (e.g. ``"score"``) only a number right after
    ``label:`` does. ``"7/10"`` and ``"7 out of 10"`` read as 7 when 10 is
    ``high``; over any other denominator they are another scale and give None.
    """

    low: float = 0.0
    high: float = 10.0
    out_of_range: str = "reject"
    """``reject``: a number outside ``[low, high]`` gives None. ``clip``: it is clipped into the range."""
    which: str = "last"
    """``last`` or ``first``: which matching number of the reply counts."""
    label: str | None = None
    """If set, only a number after ``<label>:`` (any case) counts, e.g. ``score`` for ``Score: 8``."""

    def __post_init__(self) -> None:
        _check_real(self.low, "NumberVerdict.low")
        _check_real(self.high, "NumberVerdict.high")
        if not self.high > self.low:
            raise ValueError(f"NumberVerdict needs high > low, got low={self.low!r}, high={self.high!r}")
        _check_choice(self.out_of_range, _OUT_OF_RANGE, "NumberVerdict.out_of_range")
        _check_choice(self.which, _WHICH, "NumberVerdict.which")
        if self.label is not None and (not isinstance(self.label, str) or not self.label.strip()):
            raise ValueError(f"NumberVerdict.label must be None or a non-empty string, got {self.label!r}")

    def __call__(self, text: str) -> float | None:
        window = _window(text, self.which)
        if self.label is None:
            pattern = _SCORE
        else:
            pattern = re.compile(rf"{re.escape(self.label.strip())}[ \t*]*[:=][ \t*]*{_SCORE.pattern}", re.IGNORECASE)
        matches = list(pattern.finditer(window))
        if not matches:
            return None
        match = matches[-1] if self.which == "last" else matches[0]
        value = float(match.group("x"))
        if match.group("of") is not None and float(match.group("of")) != self.high:
            return None
        if not self.low <= value <= self.high:
            if self.out_of_range == "reject":
                return None
            value = min(max(value, self.low), self.high)
        return (value - self.low) / (self.high - self.low)


@dataclass(frozen=True, kw_only=True)
class YesNoVerdict:
    """1.0 for a yes word, 0.0 for a no word (whole words, any case); None if neither appears.

    The ``which`` one of all yes and no words counts: ``last`` by default, as
    a judge that reasons first ends with its verdict.
    """

    yes_words: tuple[str, ...] = ("yes",)
    no_words: tuple[str, ...] = ("no",)
    which: str = "last"

    def __post_init__(self) -> None:
        for what in ("yes_words", "no_words"):
            words = tuple(getattr(self, what)) if isinstance(getattr(self, what), (list, tuple)) else None
            if not words or not all(isinstance(word, str) and word.strip() for word in words):
                raise ValueError(f"YesNoVerdict.{what} must be a non-empty list of words, got {getattr(self, what)!r}")
            object.__setattr__(self, what, tuple(word.strip().lower() for word in words))
        both = set(self.yes_words) & set(self.no_words)
        if both:
            raise ValueError(f"YesNoVerdict: {sorted(both)} are both yes and no words")
        _check_choice(self.which, _WHICH, "YesNoVerdict.which")

    def __call__(self, text: str) -> float | None:
        words = sorted({*self.yes_words, *self.no_words}, key=len, reverse=True)  # "not ok" before "ok"
        pattern = re.compile(r"(?<!\w)(" + "|".join(map(re.escape, words)) + r")(?!\w)", re.IGNORECASE)
        matches = list(pattern.finditer(_window(text, self.which)))
        if not matches:
            return None
        word = (matches[-1] if self.which == "last" else matches[0]).group(1).lower()
        return 1.0 if word in self.yes_words else 0.0


@dataclass(frozen=True, kw_only=True)
class RubricVerdict:
    """The sum of a rubric's points over the sum of their maxima.

    Reads lines ``criterion: points`` (maximum ``max_points``) or
    ``criterion: points/max``, optionally bulleted or numbered. With
    ``criteria`` named, exactly those count (any case) and a missing one gives
    None; without, every such line counts. A criterion given twice is
    ambiguous and gives None, as do points outside ``[0, max]`` under
    ``out_of_range="reject"`` and a reply with no rubric line.
    """

    criteria: tuple[str, ...] = ()
    max_points: float = 1.0
    out_of_range: str = "reject"

    def __post_init__(self) -> None:
        criteria = self.criteria
        if not isinstance(criteria, (list, tuple)) or not all(isinstance(c, str) and c.strip() for c in criteria):
            raise ValueError(f"RubricVerdict.criteria must be a list of names, got {criteria!r}")
        object.__setattr__(self, "criteria", tuple(c.strip() for c in criteria))
        names = [c.lower() for c in self.criteria]
        if len(set(names)) != len(names):
            raise ValueError(f"RubricVerdict.criteria names a criterion twice: {self.criteria!r}")
        _check_real(self.max_points, "RubricVerdict.max_points")
        if not self.max_points > 0:
            raise ValueError(f"RubricVerdict.max_points must be > 0, got {self.max_points!r}")
        _check_choice(self.out_of_range, _OUT_OF_RANGE, "RubricVerdict.out_of_range")

    def __call__(self, text: str) -> float | None:
        wanted = {c.lower() for c in self.criteria}
        found: dict[str, tuple[float, float]] = {}
        for line in text[:MAX_VERDICT_CHARS].splitlines()[:_MAX_RUBRIC_LINES]:
            match = _RUBRIC_LINE.match(line)
            if match is None:
                continue
            name = match.group("name").strip(" \t*_`").lower()
            if wanted and name not in wanted:
                continue
            if name in found:
                return None
            points = float(match.group("points"))
            most = float(match.group("of")) if match.group("of") is not None else float(self.max_points)
            if most <= 0:
                return None
            if not 0 <= points <= most:
                if self.out_of_range == "reject":
                    return None
                points = min(max(points, 0.0), most)
            found[name] = (points, most)
        if not found or (wanted and set(found) != wanted):
            return None
        return math.fsum(p for p, _ in found.values()) / math.fsum(m for _, m in found.values())


VerdictRule = Callable[[str], "float | None"]
"""``rule(reply_text) -> score in [0, 1] or None`` (no valid verdict)."""

VERDICT_RULES: Mapping[str, Callable[..., VerdictRule]] = MappingProxyType(
    {"number": NumberVerdict, "yes_no": YesNoVerdict, "rubric": RubricVerdict}
)


def make_verdict_rule(name: str, **params: object) -> VerdictRule:
    """``VERDICT_RULES[name](**params)``; an unknown name or parameter raises, naming what exists."""
    factory = lookup(VERDICT_RULES, name, "verdict rule")
    known = factory.__dataclass_fields__  # type: ignore[attr-defined]
    unknown = [key for key in params if key not in known]
    if unknown:
        raise ValueError(f"verdict rule {name!r} has no parameter {unknown[0]!r}; known: {', '.join(known)}")
    if "criteria" in params or "yes_words" in params or "no_words" in params:
        params = {k: tuple(v) if isinstance(v, list) else v for k, v in params.items()}  # YAML gives lists
    return factory(**params)


def yes_probability(logp_yes: float, logp_no: float) -> float:
    """P(yes) / (P(yes) + P(no)) from the two tokens' log-probabilities, computed stably.

    The score of a judge read by its next-token distribution rather than its
    sampled text (G-Eval's probability-weighted scoring, arXiv:2303.16634).
    """
    for what, value in (("logp_yes", logp_yes), ("logp_no", logp_no)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value) or value > 0:
            raise ValueError(f"{what} must be a log-probability (<= 0, -inf allowed), got {value!r}")
    if logp_yes == logp_no == -math.inf:
        raise ValueError("yes_probability: both yes and no have probability 0")
    if logp_no == -math.inf or logp_yes == -math.inf:
        return 1.0 if logp_no == -math.inf else 0.0
    diff = logp_no - logp_yes  # the logistic of -diff, without overflow either way
    return 1.0 / (1.0 + math.exp(diff)) if diff < 0 else math.exp(-diff) / (1.0 + math.exp(-diff))
