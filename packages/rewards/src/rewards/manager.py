"""The reward manager: score completions with several reward functions, weight and check them.

Plain Python floats throughout (no numpy); the package's one dependency is sympy, for
the symbolic comparison of math answers.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import math
import numbers
import threading
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

__all__ = ["ON_ERROR_CHOICES", "RewardError", "RewardManager", "RewardResult", "RewardSpec", "Scores"]

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
class RewardSpec:
    """One reward function in a manager, with its weight, its name and how it is called."""

    fn: Callable[..., Sequence[float | None]] | Callable[..., Awaitable[Sequence[float | None]]]
    """Called as ``fn(prompts, completions, **fields)`` (or with every argument by keyword, TRL's way,
    when it names a parameter ``prompts`` or ``completions``); returns one score or ``None`` per
    completion. An ``async def`` function is awaited, concurrently with the manager's other async ones."""
    weight: float = 1.0
    """Multiplies this function's scores in the total; its own scores are reported unweighted."""
    name: str | None = None
    """Key in ``RewardResult.per_function`` and in metrics; defaults to ``fn.__name__``."""
    data_sources: tuple[str, ...] | None = None
    """Score only rows whose field ``data_source`` is one of these (verl's routing); the others get
    ``None`` from it. None: every row."""
    timeout_s: float | None = None
    """A call that has not returned after this many seconds fails (its thread is left behind)."""
    on_failure: str | None = None
    """One of ``ON_ERROR_CHOICES`` for this function's failures; None: the manager's ``on_error``."""

    def __post_init__(self) -> None:
        if not callable(self.fn):
            raise TypeError(f"RewardSpec.fn must be callable, got {self.fn!r}")
        if isinstance(self.weight, bool) or not isinstance(self.weight, numbers.Real) or not math.isfinite(self.weight):
            raise ValueError(f"RewardSpec.weight must be a finite number, got {self.weight!r}")
        name = self.name if self.name is not None else getattr(self.fn, "__name__", None)
        if not isinstance(name, str) or not name or name == "<lambda>":
            raise ValueError(f"reward function {self.fn!r} needs a name: pass RewardSpec(fn, name='...')")
        if self.data_sources is not None:
            if isinstance(self.data_sources, str) or not all(isinstance(d, str) for d in self.data_sources):
                raise ValueError(f"RewardSpec.data_sources must be a list of names, got {self.data_sources!r}")
            object.__setattr__(self, "data_sources", tuple(self.data_sources))
        if self.timeout_s is not None and (isinstance(self.timeout_s, bool) or not isinstance(self.timeout_s, numbers.Real)
                                           or not self.timeout_s > 0):
            raise ValueError(f"RewardSpec.timeout_s must be a number of seconds > 0, got {self.timeout_s!r}")
        if self.on_failure is not None and self.on_failure not in ON_ERROR_CHOICES:
            raise ValueError(f"RewardSpec.on_failure must be one of {ON_ERROR_CHOICES}, got {self.on_failure!r}")
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "weight", float(self.weight))


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


@dataclass(frozen=True)
class _Scored:
    scores: tuple[float | None, ...]
    errors: tuple[RewardError, ...]
    num_failed: int
    metrics: Mapping[str, float] = field(default_factory=dict)


class _Timeout(Exception):
    pass


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
        calls = [_Call(spec, self.on_error, prompts, completions, fields, extra) for spec in self.specs]
        outcomes: dict[int, _Scored | BaseException] = {}
        waiting = [i for i, call in enumerate(calls) if call.is_async]
        if waiting:
            outcomes.update(zip(waiting, asyncio.run(_gather([calls[i] for i in waiting]))))
        plain = [i for i, call in enumerate(calls) if not call.is_async]
        if self.max_workers is not None and self.max_workers > 1 and len(plain) > 1:
            with ThreadPoolExecutor(max_workers=min(self.max_workers, len(plain))) as pool:
                outcomes.update(zip(plain, pool.map(_outcome, [calls[i] for i in plain])))
        else:
            outcomes.update((i, _outcome(calls[i])) for i in plain)
        scored: list[_Scored] = []
        for i in range(len(calls)):  # in spec order: the same first error as in turn
            outcome = outcomes[i]
            if isinstance(outcome, BaseException):
                raise outcome
            scored.append(outcome)
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


class _Call:
    """One function's call on one batch: its rows (after routing), its arguments and the checks of what it
    returns. Holds nothing between batches."""

    def __init__(self, spec: RewardSpec, on_error: str, prompts: Sequence[str], completions: Sequence[str],
                 fields: dict[str, list[object]], extra: dict[str, object]) -> None:
        self.spec, self.n = spec, len(completions)
        self.policy = spec.on_failure or on_error
        self.completions = completions
        self.rows = fields.get(ROW_FIELD)
        self.indices = list(range(self.n))
        if spec.data_sources is not None:
            if "data_source" not in fields:
                raise ValueError(f"reward function {spec.name!r} is routed to data_sources {list(spec.data_sources)}, "
                                 "but the rows have no data_source field")
            self.indices = [i for i in self.indices if fields["data_source"][i] in spec.data_sources]
        pick = (lambda values: [values[i] for i in self.indices])  # fresh copies: a function may not change another's
        self.args = (pick(prompts), pick(completions))
        self.kwargs = {k: pick(v) for k, v in fields.items()} | extra
        self.is_async = _is_async(spec.fn)

    def call(self) -> object:
        by_keyword, accepted = _call_style(self.spec.fn)
        kwargs = self.kwargs if accepted is None else {k: v for k, v in self.kwargs.items() if k in accepted}
        if by_keyword:
            both = {"prompts": self.args[0], "completions": self.args[1]}
            kwargs = {k: v for k, v in both.items() if accepted is None or k in accepted} | kwargs
            return self.spec.fn(**kwargs)
        return self.spec.fn(*self.args, **kwargs)

    def where(self, index: int) -> str:
        row = f" (row {self.rows[index]})" if self.rows is not None else ""
        return f"completion {index}{row}"

    def fail(self, message: str, index: int | None = None, cause: BaseException | None = None) -> _Scored:
        completion = None if index is None else shorten(self.completions[index])
        error = RewardError(message, function=self.spec.name, index=index, completion=completion)
        if self.policy == "raise":
            raise error from cause
        failed = (0.0 if self.policy == "zero" else None,)
        return _Scored(failed * self.n, (error,), self.n)

    def check(self, raw: object) -> _Scored:
        """The scores of `raw` (what the function returned) at every completion, ``None`` where it gave none."""
        name, n = self.spec.name, len(self.indices)
        if not _is_list_like(raw) or len(raw) != n:
            got = f"{len(raw)} scores" if _is_list_like(raw) else f"{repr(raw)[:_SHOWN_CHARS]} (not a list)"
            return self.fail(f"reward function {name!r} returned {got} for {n} completions")
        metrics = _call_metrics(name, raw)
        scores: list[float | None] = [None] * self.n
        errors: list[RewardError] = []
        for index, score in zip(self.indices, list(raw)):
            if score is None:
                continue
            problem = _score_problem(score)
            if problem is None:
                scores[index] = float(score)
                continue
            completion = shorten(self.completions[index])
            error = RewardError(
                f"reward function {name!r} returned {problem} for {self.where(index)}: {completion}",
                function=name, index=index, completion=completion,
            )
            if self.policy == "raise":
                raise error
            errors.append(error)
            scores[index] = 0.0 if self.policy == "zero" else None
        return _Scored(tuple(scores), tuple(errors), len(errors), metrics)

    def failed_call(self, exc: BaseException) -> _Scored:
        name = self.spec.name
        first = f", the first {self.where(self.indices[0])}" if self.indices and self.rows is not None else ""
        if isinstance(exc, _Timeout):
            what = f"did not return within timeout_s = {self.spec.timeout_s:g} s"
        else:
            what = f"raised {type(exc).__name__}: {exc}"
        return self.fail(f"reward function {name!r} {what} (on a batch of {len(self.indices)} completions{first})",
                         cause=None if isinstance(exc, _Timeout) else exc)


def _outcome(call: _Call) -> _Scored | BaseException:
    """The checked scores of a plain function's call, or the error to raise (in spec order, by the caller)."""
    if not call.indices:
        return _Scored((None,) * call.n, (), 0)
    try:
        try:
            raw = _with_timeout(call.call, call.spec.timeout_s)
        except KeyboardInterrupt:
            raise  # Ctrl-C stops the run; it is not the reward's failure
        except BaseException as exc:  # noqa: BLE001 - SystemExit from a reward must not end the run unnamed
            return call.failed_call(exc)
        return call.check(raw)
    except RewardError as error:
        return error


async def _gather(calls: Sequence[_Call]) -> list[_Scored | BaseException]:
    async def one(call: _Call) -> _Scored | BaseException:
        if not call.indices:
            return _Scored((None,) * call.n, (), 0)
        try:
            try:
                raw = await asyncio.wait_for(call.call(), call.spec.timeout_s)
            except asyncio.TimeoutError:
                return call.failed_call(_Timeout())
            except KeyboardInterrupt:
                raise
            except Exception as exc:  # noqa: BLE001 - named like a plain function's
                return call.failed_call(exc)
            return call.check(raw)
        except RewardError as error:
            return error

    return list(await asyncio.gather(*(one(call) for call in calls)))


def _with_timeout(call: Callable[[], object], timeout_s: float | None) -> object:
    """`call()`, or _Timeout when it has not returned within `timeout_s` (its daemon thread is abandoned:
    Python cannot stop a thread; a function that may hang forever belongs in a process)."""
    if timeout_s is None:
        return call()
    box: dict[str, object] = {}

    def target() -> None:
        try:
            box["value"] = call()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            box["error"] = exc

    thread = threading.Thread(target=target, daemon=True, name="reward-call")
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise _Timeout()
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box["value"]


def _is_async(fn: Callable[..., object]) -> bool:
    target = fn.func if isinstance(fn, functools.partial) else fn
    return inspect.iscoroutinefunction(target) or inspect.iscoroutinefunction(getattr(target, "__call__", None))


def _call_style(fn: Callable[..., object]) -> tuple[bool, set[str] | None]:
    """(pass prompts and completions by keyword, the keyword names it accepts or None for any).

    TRL calls ``reward_func(prompts=..., completions=..., completion_ids=..., **columns)``: a function
    that names a parameter ``prompts`` or ``completions`` is called that way; one that takes
    ``**kwargs`` gets every field; one that does not gets the fields it names."""
    try:
        parameters = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # a builtin without a signature: the old positional call
        return False, None
    named = {p.name for p in parameters.values() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    any_keyword = any(p.kind is p.VAR_KEYWORD for p in parameters.values())
    return bool({"prompts", "completions"} & named), None if any_keyword else named


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
        if not isinstance(name, str) or not name.isidentifier() or name in ("prompts", "completions", "step"):
            raise ValueError(f"field name {name!r} cannot be passed as a keyword argument")
        if not _is_list_like(values):
            got = type(values).__name__
            raise ValueError(f"field {name!r} must be a list with one entry per completion, got {got}")
        if len(values) != n:
            raise ValueError(f"field {name!r} has {len(values)} entries for {n} completions")
        checked[name] = list(values)
    return checked
