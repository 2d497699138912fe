"""The reward manager: score completions with several reward functions, weight and check them.

Plain Python floats throughout (no numpy); the package's one dependency is sympy, for
the symbolic comparison of math answers.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from rewards.calls import Call, gather, outcome
from rewards.scores import ON_ERROR_CHOICES, ROW_FIELD, RewardError, Scored, Scores, is_list_like
from rewards.spec import RewardSpec

__all__ = ["ON_ERROR_CHOICES", "ROW_FIELD", "RewardError", "RewardManager", "RewardResult", "RewardSpec", "Scores"]


@dataclass(frozen=True)
class RewardResult:
    """Scores of one batch of N completions."""

    total: tuple[float, ...]
    """Weighted sum of every function's scores, one per completion (unscored and failed ones add 0)."""
    per_function: dict[str, tuple[float, ...]]
    """Each function's unweighted scores, by name, in the manager's order (0.0 where it gave none)."""
    num_failed: int = 0
    """Scores that failed and were set to 0 or skipped (``on_error`` zero or skip); a failed call counts N."""
    errors: tuple[RewardError, ...] = field(default=(), repr=False)
    """The failures behind ``num_failed``."""
    function_metrics: dict[str, float] = field(default_factory=dict)
    """What functions returning ``Scores`` reported about their calls (e.g. ``time/judge``), summed by key,
    and ``rewards/<name>/unscored``: the completions a function gave no score."""
    scored: dict[str, tuple[bool, ...]] = field(default_factory=dict)
    """Per function, which completions it scored (False: it returned None, the row was routed away
    by ``data_sources`` or its score failed under ``skip``); absent: all of them."""

    def metrics(self) -> dict[str, float]:
        """``rewards/<name>/mean``, ``rewards/<name>/frac_positive`` (share of scores > 0) per function over
        the completions it scored (``function_metrics`` count the others, ``rewards/<name>/unscored``),
        then ``rewards/total/mean``, ``rewards/total/std`` (population std) and ``rewards/failed``."""
        result: dict[str, float] = {}
        for name, scores in self.per_function.items():
            mask = self.scored.get(name)
            kept = list(scores) if mask is None else [s for s, ok in zip(scores, mask) if ok]
            result[f"rewards/{name}/mean"] = _mean(kept) if kept else 0.0
            result[f"rewards/{name}/frac_positive"] = sum(score > 0 for score in kept) / len(kept) if kept else 0.0
        mean = _mean(self.total)
        result["rewards/total/mean"] = mean
        result["rewards/total/std"] = math.sqrt(_mean([(value - mean) ** 2 for value in self.total]))
        result["rewards/failed"] = float(self.num_failed)
        return result | self.function_metrics


def _mean(values: Sequence[float]) -> float:
    return math.fsum(values) / len(values)


class RewardManager:
    """Scores completions with each reward function, checks their outputs and combines them by weight.

    ``specs``: RewardSpecs or plain callables (weight 1, named by ``__name__``);
    names must be unique. ``on_error``: one of ``ON_ERROR_CHOICES``.
    ``max_workers``: above 1, the plain functions run concurrently in a thread pool
    (one task per function); results are identical to running them in turn. ``async def``
    functions always run concurrently with each other, in one event loop.
    ``correctness``: the name of the function whose score says whether an answer
    is right (what accuracy and DAPO's group filter look at); default: the first.

    Calls may overlap: with ``training.max_staleness >= 2`` up to k scorings of different
    batches run at once, each in its own thread, so a function is called again before its
    previous call has returned. A function that keeps state between calls (a cache, counters,
    a model) must make each call's state its own or guard what it shares with a lock; the
    manager gives every call fresh copies of its inputs and keeps nothing of a call.
    """

    def __init__(
        self,
        specs: Sequence[RewardSpec | Callable[..., Sequence[float]]],
        *,
        on_error: str = "raise",
        max_workers: int | None = None,
        correctness: str | None = None,
    ) -> None:
        self.specs: tuple[RewardSpec, ...] = tuple(s if isinstance(s, RewardSpec) else RewardSpec(s) for s in specs)
        if not self.specs:
            raise ValueError("RewardManager needs at least one reward function")
        seen: dict[str, RewardSpec] = {}
        for spec in self.specs:
            if spec.name in seen:
                raise ValueError(
                    f"two reward functions are named {spec.name!r} ({seen[spec.name].fn!r} and {spec.fn!r});"
                    " give one another name with RewardSpec(fn, name='...')"
                )
            seen[spec.name] = spec
        if on_error not in ON_ERROR_CHOICES:
            raise ValueError(f"on_error must be one of {ON_ERROR_CHOICES}, got {on_error!r}")
        valid_workers = isinstance(max_workers, int) and not isinstance(max_workers, bool) and max_workers >= 1
        if max_workers is not None and not valid_workers:
            raise ValueError(f"max_workers must be None or an int >= 1, got {max_workers!r}")
        self.on_error = on_error
        self.max_workers = max_workers
        if correctness is not None and correctness not in seen:
            raise ValueError(f"correctness={correctness!r} names no reward function; known: {list(seen)}")
        self.correctness: str = correctness if correctness is not None else self.specs[0].name

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(spec.name for spec in self.specs)

    def with_functions(self, specs: Sequence[RewardSpec | Callable[..., Sequence[float]]]) -> RewardManager:
        """A new manager with `specs` added after this one's (same settings; this one is unchanged)."""
        if not specs:
            return self
        return RewardManager(
            [*self.specs, *specs], on_error=self.on_error, max_workers=self.max_workers, correctness=self.correctness
        )

    def __repr__(self) -> str:
        weights = ", ".join(f"{spec.name}={spec.weight:g}" for spec in self.specs)
        return (
            f"RewardManager({weights}; correctness={self.correctness!r}, on_error={self.on_error!r}, "
            f"max_workers={self.max_workers})"
        )

    def score(
        self,
        prompts: Sequence[str],
        completions: Sequence[str],
        fields: Mapping[str, Sequence[object]] | None = None,
        *,
        step: int | None = None,
    ) -> RewardResult:
        """Score N completions; ``fields`` (e.g. ``{"answer": [...]}``) are passed to every function by name,
        and ``step`` (the training step) as the keyword ``step`` to the functions that take it.

        Raises ValueError on inconsistent inputs and RewardError when a reward
        function fails (unless ``on_error`` is zero or skip); nothing partial is returned.
        """
        fields = _check_inputs(prompts, completions, fields or {})
        extra = {} if step is None else {"step": step}
        calls = [Call(spec, self.on_error, prompts, completions, fields, extra) for spec in self.specs]
        outcomes: dict[int, Scored | BaseException] = {}
        waiting = [i for i, call in enumerate(calls) if call.is_async]
        if waiting:
            outcomes.update(zip(waiting, asyncio.run(gather([calls[i] for i in waiting]))))
        plain = [i for i, call in enumerate(calls) if not call.is_async]
        if self.max_workers is not None and self.max_workers > 1 and len(plain) > 1:
            with ThreadPoolExecutor(max_workers=min(self.max_workers, len(plain))) as pool:
                outcomes.update(zip(plain, pool.map(outcome, [calls[i] for i in plain])))
        else:
            outcomes.update((i, outcome(calls[i])) for i in plain)
        scored: list[Scored] = []
        for i in range(len(calls)):  # in spec order: the same first error as in turn
            got = outcomes[i]
            if isinstance(got, BaseException):
                raise got
            scored.append(got)
        total = [0.0] * len(completions)
        function_metrics: dict[str, float] = {}
        for spec, result in zip(self.specs, scored):
            total = [t + spec.weight * s if s is not None else t for t, s in zip(total, result.scores)]
            for key, value in result.metrics.items():
                function_metrics[key] = function_metrics.get(key, 0.0) + value
            unscored = sum(s is None for s in result.scores)
            if unscored:  # None, routed away or skipped: the learner's per-function mean counts them as 0
                key = f"rewards/{spec.name}/unscored"
                function_metrics[key] = function_metrics.get(key, 0.0) + unscored
        return RewardResult(
            total=tuple(total),
            per_function={spec.name: tuple(0.0 if s is None else s for s in result.scores)
                          for spec, result in zip(self.specs, scored)},
            num_failed=sum(result.num_failed for result in scored),
            errors=tuple(error for result in scored for error in result.errors),
            function_metrics=function_metrics,
            scored={spec.name: tuple(s is not None for s in result.scores) for spec, result in zip(self.specs, scored)
                    if any(s is None for s in result.scores)},
        )


def _check_inputs(
    prompts: Sequence[str], completions: Sequence[str], fields: Mapping[str, Sequence[object]]
) -> dict[str, list[object]]:
    """Raise ValueError naming the culprit unless prompts, completions and every field align."""
    n = len(completions)
    if n == 0:
        raise ValueError("score() needs at least one completion")
    if len(prompts) != n:
        raise ValueError(f"got {len(prompts)} prompts for {n} completions")
    for what, texts in (("prompts", prompts), ("completions", completions)):
        for index, text in enumerate(texts):
            if not isinstance(text, str):
                raise ValueError(f"{what}[{index}] is {type(text).__name__}, not str")
    checked: dict[str, list[object]] = {}
    for name, values in fields.items():
        if not isinstance(name, str) or not name.isidentifier() or name in ("prompts", "completions", "step"):
            raise ValueError(f"field name {name!r} cannot be passed as a keyword argument")
        if not is_list_like(values):
            got = type(values).__name__
            raise ValueError(f"field {name!r} must be a list with one entry per completion, got {got}")
        if len(values) != n:
            raise ValueError(f"field {name!r} has {len(values)} entries for {n} completions")
        checked[name] = list(values)
    return checked
