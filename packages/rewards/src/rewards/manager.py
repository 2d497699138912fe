"""The reward manager: score completions with several reward functions, weight and check them.

Plain Python floats throughout (no numpy); the package's one dependency is sympy, for
the symbolic comparison of math answers.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Collection, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

__all__ = ["ON_ERROR_CHOICES", "RewardError", "RewardManager", "RewardResult", "RewardSpec", "Scores"]

ON_ERROR_CHOICES = ("raise", "zero")
"""``raise``: a failing reward function fails the call. ``zero``: its failed scores become 0 and are counted."""

_SHOWN_CHARS = 80


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
class RewardSpec:
    """One reward function in a manager, with its weight and its name."""

    fn: Callable[..., Sequence[float]]
    """Called as ``fn(prompts, completions, **fields)``; returns one score per completion."""
    weight: float = 1.0
    """Multiplies this function's scores in the total; its own scores are reported unweighted."""
    name: str | None = None
    """Key in ``RewardResult.per_function`` and in metrics; defaults to ``fn.__name__``."""

    def __post_init__(self) -> None:
        if not callable(self.fn):
            raise TypeError(f"RewardSpec.fn must be callable, got {self.fn!r}")
        if isinstance(self.weight, bool) or not isinstance(self.weight, numbers.Real) or not math.isfinite(self.weight):
            raise ValueError(f"RewardSpec.weight must be a finite number, got {self.weight!r}")
        name = self.name if self.name is not None else getattr(self.fn, "__name__", None)
        if not isinstance(name, str) or not name or name == "<lambda>":
            raise ValueError(f"reward function {self.fn!r} needs a name: pass RewardSpec(fn, name='...')")
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "weight", float(self.weight))


@dataclass(frozen=True)
class RewardResult:
    """Scores of one batch of N completions."""

    total: tuple[float, ...]
    """Weighted sum of every function's scores, one per completion (failed scores count as 0)."""
    per_function: dict[str, tuple[float, ...]]
    """Each function's unweighted scores, by name, in the manager's order."""
    num_failed: int = 0
    """Scores that failed and were set to 0 (``on_error="zero"`` only); a failed call counts N."""
    errors: tuple[RewardError, ...] = field(default=(), repr=False)
    """The failures behind ``num_failed``."""
    function_metrics: dict[str, float] = field(default_factory=dict)
    """What functions returning ``Scores`` reported about their calls (e.g. ``time/judge``), summed by key."""

    def metrics(self) -> dict[str, float]:
        """``rewards/<name>/mean``, ``rewards/<name>/frac_positive`` (share of scores > 0) per function,
        then ``rewards/total/mean``, ``rewards/total/std`` (population std) and ``rewards/failed``."""
        result: dict[str, float] = {}
        for name, scores in self.per_function.items():
            result[f"rewards/{name}/mean"] = _mean(scores)
            result[f"rewards/{name}/frac_positive"] = sum(score > 0 for score in scores) / len(scores)
        mean = _mean(self.total)
        result["rewards/total/mean"] = mean
        result["rewards/total/std"] = math.sqrt(_mean([(value - mean) ** 2 for value in self.total]))
        result["rewards/failed"] = float(self.num_failed)
        return result | self.function_metrics


def _mean(values: Sequence[float]) -> float:
    return math.fsum(values) / len(values)


@dataclass(frozen=True)
class _Scored:
    scores: tuple[float, ...]
    errors: tuple[RewardError, ...]
    num_failed: int
    metrics: Mapping[str, float] = field(default_factory=dict)


class RewardManager:
    """Scores completions with each reward function, checks their outputs and combines them by weight.

    ``specs``: RewardSpecs or plain callables (weight 1, named by ``__name__``);
    names must be unique. ``on_error``: one of ``ON_ERROR_CHOICES``.
    ``max_workers``: above 1, the functions run concurrently in a thread pool
    (one task per function); results are identical to running them in turn.
    ``correctness``: the name of the function whose score says whether an answer
    is right (what accuracy and DAPO's group filter look at); default: the first.
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
        self, prompts: Sequence[str], completions: Sequence[str], fields: Mapping[str, Sequence[object]] | None = None
    ) -> RewardResult:
        """Score N completions; ``fields`` (e.g. ``{"answer": [...]}``) are passed to every function by name.

        Raises ValueError on inconsistent inputs and RewardError when a reward
        function fails (unless ``on_error="zero"``); nothing partial is returned.
        """
        fields = _check_inputs(prompts, completions, fields or {})
        if self.max_workers is not None and self.max_workers > 1 and len(self.specs) > 1:
            with ThreadPoolExecutor(max_workers=min(self.max_workers, len(self.specs))) as pool:
                futures = [pool.submit(self._run, spec, prompts, completions, fields) for spec in self.specs]
                scored = [future.result() for future in futures]  # in spec order: the same first error as in turn
        else:
            scored = [self._run(spec, prompts, completions, fields) for spec in self.specs]
        total = [0.0] * len(completions)
        function_metrics: dict[str, float] = {}
        for spec, result in zip(self.specs, scored):
            total = [t + spec.weight * s for t, s in zip(total, result.scores)]
            for key, value in result.metrics.items():
                function_metrics[key] = function_metrics.get(key, 0.0) + value
        return RewardResult(
            total=tuple(total),
            per_function={spec.name: result.scores for spec, result in zip(self.specs, scored)},
            num_failed=sum(result.num_failed for result in scored),
            errors=tuple(error for result in scored for error in result.errors),
            function_metrics=function_metrics,
        )

    def _run(
        self, spec: RewardSpec, prompts: Sequence[str], completions: Sequence[str], fields: dict[str, list[object]]
    ) -> _Scored:
        """Call one function on fresh copies of the inputs (it may not change the caller's or another's)."""
        n = len(completions)
        try:
            raw = spec.fn(list(prompts), list(completions), **{k: list(v) for k, v in fields.items()})
        except KeyboardInterrupt:
            raise  # Ctrl-C stops the run; it is not the reward's failure
        except BaseException as exc:  # noqa: BLE001 - SystemExit from a reward must not end the run unnamed
            error = RewardError(
                f"reward function {spec.name!r} raised {type(exc).__name__}: {exc} (on a batch of {n} completions)",
                function=spec.name,
            )
            if self.on_error == "raise":
                raise error from exc
            return _Scored((0.0,) * n, (error,), n)
        if not _is_list_like(raw) or len(raw) != n:
            got = f"{len(raw)} scores" if _is_list_like(raw) else f"{repr(raw)[:_SHOWN_CHARS]} (not a list)"
            error = RewardError(
                f"reward function {spec.name!r} returned {got} for {n} completions", function=spec.name
            )
            if self.on_error == "raise":
                raise error
            return _Scored((0.0,) * n, (error,), n)
        metrics = _call_metrics(spec.name, raw)
        scores: list[float] = []
        errors: list[RewardError] = []
        for index, score in enumerate(list(raw)):
            problem = _score_problem(score)
            if problem is None:
                scores.append(float(score))
                continue
            completion = shorten(completions[index])
            error = RewardError(
                f"reward function {spec.name!r} returned {problem} for completion {index}: {completion}",
                function=spec.name,
                index=index,
                completion=completion,
            )
            if self.on_error == "raise":
                raise error
            errors.append(error)
            scores.append(0.0)
        return _Scored(tuple(scores), tuple(errors), len(errors), metrics)


def _call_metrics(name: str, raw: object) -> dict[str, float]:
    """The metrics a function returned with its ``Scores``: finite numbers under metric-like names."""
    metrics = getattr(raw, "metrics", None) if isinstance(raw, Scores) else None
    out: dict[str, float] = {}
    for key, value in (metrics or {}).items():
        if not isinstance(key, str) or not key.startswith(("time/", "rewards/")):
            raise RewardError(
                f"reward function {name!r} reported a metric named {key!r}; name them time/<what> or "
                "rewards/<name>/<what>", function=name,
            )
        if _score_problem(value) is not None:
            raise RewardError(f"reward function {name!r} reported {key} = {value!r}, not a finite number",
                              function=name)
        out[key] = float(value)
    return out


def _is_list_like(value: object) -> bool:
    """A list, tuple, numpy array...: sized and iterable, but not text or a mapping."""
    return isinstance(value, Collection) and not isinstance(value, (str, bytes, Mapping))


def _score_problem(score: object) -> str | None:
    """What is wrong with one score, or None if it is a finite real number."""
    if isinstance(score, bool) or not isinstance(score, numbers.Real):
        return f"a non-number {repr(score)[:40]} ({type(score).__name__})"
    if not math.isfinite(score):
        return f"a non-finite score {float(score)!r}"
    return None


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
        if not isinstance(name, str) or not name.isidentifier() or name in ("prompts", "completions"):
            raise ValueError(f"field name {name!r} cannot be passed as a keyword argument")
        if not _is_list_like(values):
            got = type(values).__name__
            raise ValueError(f"field {name!r} must be a list with one entry per completion, got {got}")
        if len(values) != n:
            raise ValueError(f"field {name!r} has {len(values)} entries for {n} completions")
        checked[name] = list(values)
    return checked
