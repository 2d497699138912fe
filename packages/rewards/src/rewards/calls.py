"""One function's call on one batch: routing by data_source, the keyword call (TRL's signature), async
functions gathered in one event loop, the timeout, and the checks of what comes back."""

from __future__ import annotations

import asyncio
import functools
import inspect
import threading
from collections.abc import Callable, Sequence

from rewards.scores import ROW_FIELD, RewardError, Scored, call_metrics, is_list_like, score_problem, shorten
from rewards.spec import RewardSpec

__all__ = ["Call", "gather", "outcome"]

_SHOWN_CHARS = 80


class _Timeout(Exception):
    pass


class Call:
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

    def fail(self, message: str, index: int | None = None, cause: BaseException | None = None) -> Scored:
        completion = None if index is None else shorten(self.completions[index])
        error = RewardError(message, function=self.spec.name, index=index, completion=completion)
        if self.policy == "raise":
            raise error from cause
        failed = (0.0 if self.policy == "zero" else None,)
        return Scored(failed * self.n, (error,), self.n)

    def check(self, raw: object) -> Scored:
        """The scores of `raw` (what the function returned) at every completion, ``None`` where it gave none."""
        name, n = self.spec.name, len(self.indices)
        if not is_list_like(raw) or len(raw) != n:
            got = f"{len(raw)} scores" if is_list_like(raw) else f"{repr(raw)[:_SHOWN_CHARS]} (not a list)"
            return self.fail(f"reward function {name!r} returned {got} for {n} completions")
        metrics = call_metrics(name, raw)
        scores: list[float | None] = [None] * self.n
        errors: list[RewardError] = []
        for index, score in zip(self.indices, list(raw)):
            if score is None:
                continue
            problem = score_problem(score)
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
        return Scored(tuple(scores), tuple(errors), len(errors), metrics)

    def failed_call(self, exc: BaseException) -> Scored:
        name = self.spec.name
        first = f", the first {self.where(self.indices[0])}" if self.indices and self.rows is not None else ""
        if isinstance(exc, _Timeout):
            what = f"did not return within timeout_s = {self.spec.timeout_s:g} s"
        else:
            what = f"raised {type(exc).__name__}: {exc}"
        return self.fail(f"reward function {name!r} {what} (on a batch of {len(self.indices)} completions{first})",
                         cause=None if isinstance(exc, _Timeout) else exc)


def outcome(call: Call) -> Scored | BaseException:
    """The checked scores of a plain function's call, or the error to raise (in spec order, by the caller)."""
    if not call.indices:
        return Scored((None,) * call.n, (), 0)
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


async def gather(calls: Sequence[Call]) -> list[Scored | BaseException]:
    async def one(call: Call) -> Scored | BaseException:
        if not call.indices:
            return Scored((None,) * call.n, (), 0)
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
