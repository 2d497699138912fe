"""Choosing samples of a run (records of samples.jsonl): `trainer samples`' filter, and the best
and worst of a step that `trainer show` prints."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from rl_core import ConfigError


@dataclasses.dataclass(frozen=True, kw_only=True)
class SampleFilter:
    """What a sample must match; None: anything. Bounds are inclusive."""

    steps: tuple[tuple[int, int], ...] = ()
    """Step ranges (first, last); empty: every step."""
    min_reward: float | None = None
    max_reward: float | None = None
    min_length: int | None = None
    """Completion tokens (samples.jsonl's `length`; a record without one matches no length bound)."""
    max_length: int | None = None
    contains: str | None = None
    """Text in the sample's whole text, the prompt followed by the completion as the model read and wrote
    them (case-insensitive): `=12` finds `5+7=` answered `12`."""
    regex: str | None = None
    """A regular expression searched in the completion."""

    def __post_init__(self) -> None:
        if self.regex is not None:
            try:
                re.compile(self.regex)
            except re.error as e:
                raise ConfigError(f"--regex {self.regex!r}: not a regular expression ({e})") from None
        for low, high in (("min_reward", "max_reward"), ("min_length", "max_length")):
            a, b = getattr(self, low), getattr(self, high)
            if a is not None and b is not None and a > b:
                raise ConfigError(f"--{low.replace('_', '-')} {a} is above --{high.replace('_', '-')} {b}: nothing can match")

    def matches(self, sample: Mapping[str, Any]) -> bool:
        step, reward, length = sample.get("step"), sample.get("reward"), sample.get("length")
        if self.steps and not any(first <= step <= last for first, last in self.steps):
            return False
        if self.min_reward is not None and not (isinstance(reward, (int, float)) and reward >= self.min_reward):
            return False
        if self.max_reward is not None and not (isinstance(reward, (int, float)) and reward <= self.max_reward):
            return False
        if self.min_length is not None and not (isinstance(length, int) and length >= self.min_length):
            return False
        if self.max_length is not None and not (isinstance(length, int) and length <= self.max_length):
            return False
        text = f"{sample.get('prompt', '')}{sample.get('completion', '')}"  # one sequence: a match may span both
        if self.contains is not None and self.contains.lower() not in text.lower():
            return False
        return self.regex is None or re.search(self.regex, sample.get("completion", "")) is not None


def parse_steps(texts: Iterable[str]) -> tuple[tuple[int, int], ...]:
    """["3", "10:20", "40:"] -> ((3, 3), (10, 20), (40, maxsize)): single steps and ranges (inclusive)."""
    out = []
    for text in texts:
        for part in filter(None, (p.strip() for p in text.split(","))):
            first, colon, last = part.partition(":")
            try:
                low = int(first) if first else 0
                high = (int(last) if last else 2**63 - 1) if colon else low
            except ValueError:
                raise ConfigError(f"--step {part!r}: expected a step (12), a range (10:20) or an open range (40:)") from None
            if low > high:
                raise ConfigError(f"--step {part!r}: the range's first step is after its last")
            out.append((low, high))
    return tuple(out)


def select(samples: Iterable[Mapping[str, Any]], where: SampleFilter) -> list[Mapping[str, Any]]:
    return [s for s in samples if where.matches(s)]


def best_and_worst(samples: Sequence[Mapping[str, Any]], count: int) -> tuple[list[Mapping[str, Any]], list[Mapping[str, Any]]]:
    """(the `count` highest-rewarded samples, best first; the `count` lowest, worst first), without
    a sample in both when there are fewer than 2 * count; ties keep the file's order."""
    ranked = sorted(samples, key=lambda s: -s.get("reward", 0.0))
    best = ranked[:count]
    rest = ranked[len(best):]
    worst = sorted(rest, key=lambda s: s.get("reward", 0.0))[:count]
    return best, worst


def chosen_steps(samples: Sequence[Mapping[str, Any]], asked: tuple[tuple[int, int], ...]) -> list[int]:
    """The steps whose samples `trainer show` prints: those asked for, else the first and the last."""
    steps = sorted({s["step"] for s in samples})
    if asked:
        return [step for step in steps if any(first <= step <= last for first, last in asked)]
    return sorted({steps[0], steps[-1]}) if steps else []
