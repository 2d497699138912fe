"""Remote rewards: scores from an HTTP service (a JSON scorer or a chat-completions judge).

One call scores a batch of completions: cached ones are answered at once, the
rest go out as requests on a bounded pool of threads sharing one ``httpx``
client (at most ``concurrency`` in flight). Each request has a timeout
(connect, read, write and pool, ``timeout_s`` each) and up to ``retries``
retries on a transport error, a timeout, HTTP 429 or 5xx, waiting
``Retry-After`` when the server sends it, else ``backoff_s`` doubled each time
(with jitter). The whole call returns within ``step_timeout_s`` whatever the
server does: requests still out then count as failed.

A completion that gets no score (the retries ran out, another HTTP error, a
malformed reply, no verdict in a judge's text) is handled by ``on_failure``:

- ``score``: it gets the ``fallback`` score;
- ``skip``: every completion of its group gets ``fallback``, so this reward
  gives that group no signal (all advantages of a group with equal rewards are
  0). A group is a run of equal prompts, as the learner lays them out; with
  this reward alone the group then trains on nothing but its KL term;
- ``stop``: the call raises ``RemoteRewardError`` naming the completion and
  what happened, and the reward manager stops the run with it.

Counted per call and returned with the scores (``rewards.Scores``), so each step logs
``rewards/<name>/<counter>``:
``requests`` (HTTP attempts), ``retries``, ``failed`` (completions without a
score), ``fallback`` (scores set to ``fallback``), ``skipped_groups``,
``cache_hits`` and ``latency_s`` (seconds spent waiting on replies, summed
over requests: divide by ``requests`` for the mean).

The design of a reward served over HTTP follows verl's reward loop
(docs/advance/reward_loop.rst) and the OpenAI chat-completions API.
"""

from __future__ import annotations

import concurrent.futures
import email.utils
import json
import os
import random
import re
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from rewards.manager import Scores
from rewards.remote_endpoints import Item, JudgeEndpoint, ReplyError, ScoreEndpoint

__all__ = ["COUNTERS", "FAILURE_POLICIES", "RemoteReward", "RemoteRewardError", "RemoteSettings", "remote_judge",
           "remote_score"]

FAILURE_POLICIES = ("score", "skip", "stop")
COUNTERS = ("requests", "retries", "failed", "fallback", "skipped_groups", "cache_hits", "latency_s")
_RETRY_STATUS = frozenset({429, 500, 502, 503, 504})


class RemoteRewardError(RuntimeError):
    """A remote reward gave up on a completion under ``on_failure="stop"``."""


def _positive(value: object, what: str, *, zero: bool = False) -> None:
    ok = not isinstance(value, bool) and isinstance(value, (int, float)) and (value >= 0 if zero else value > 0)
    if not ok or value != value or value == float("inf"):
        raise ValueError(f"{what} must be a finite number {'>= 0' if zero else '> 0'}, got {value!r}")


@dataclass(frozen=True, kw_only=True)
class RemoteSettings:
    """How a remote reward talks to its server and what a failure costs."""

    url: str
    """The endpoint, e.g. http://127.0.0.1:8000/score or http://host:8000/v1/chat/completions."""
    timeout_s: float = 30.0
    """Connect, read, write and pool timeout of each request attempt."""
    retries: int = 2
    """Retries of a request after a transport error, a timeout, HTTP 429 or 5xx."""
    backoff_s: float = 0.5
    """Wait before the first retry, doubled before each next one (0.5 to 1 times that, jittered)."""
    max_backoff_s: float = 10.0
    """Longest wait between attempts, also for a server's Retry-After."""
    concurrency: int = 8
    """Requests in flight at once."""
    step_timeout_s: float = 300.0
    """Longest one call (one step's batch) may take; requests still out then fail."""
    on_failure: str = "score"
    """score (give `fallback`), skip (the completion's group gets `fallback`, no signal) or stop (raise)."""
    fallback: float = 0.0
    """The score of a failed completion (on_failure score) or of a skipped group's completions."""
    cache_size: int = 10_000
    """Scores kept, by (prompt, completion, fields sent); 0 = no cache."""
    fields: tuple[str, ...] = ()
    """Task fields sent with each completion (e.g. [answer]); a judge also sends those its template names."""
    api_key_env: str | None = None
    """An environment variable holding a key sent as `Authorization: Bearer <key>`."""

    def __post_init__(self) -> None:
        if not isinstance(self.url, str) or not self.url.startswith(("http://", "https://")):
            raise ValueError(f"url must be an http:// or https:// URL, got {self.url!r}")
        for name in ("timeout_s", "max_backoff_s", "step_timeout_s"):
            _positive(getattr(self, name), name)
        _positive(self.backoff_s, "backoff_s", zero=True)
        for name, least in (("retries", 0), ("concurrency", 1), ("cache_size", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"{name} must be an int >= {least}, got {value!r}")
        if self.on_failure not in FAILURE_POLICIES:
            raise ValueError(f"on_failure must be one of {FAILURE_POLICIES}, got {self.on_failure!r}")
        if isinstance(self.fallback, bool) or not isinstance(self.fallback, (int, float)) or self.fallback != self.fallback:
            raise ValueError(f"fallback must be a number, got {self.fallback!r}")
        fields = self.fields
        if not isinstance(fields, (list, tuple)) or not all(isinstance(f, str) and f.isidentifier() for f in fields):
            raise ValueError(f"fields must be a list of task field names, got {fields!r}")
        object.__setattr__(self, "fields", tuple(fields))
        if self.api_key_env is not None and not os.environ.get(self.api_key_env):
            raise ValueError(f"api_key_env = {self.api_key_env!r}: that environment variable is not set")


@dataclass
class _Unit:
    """One request: the batch indices it scores and what it sends."""

    indices: list[int]
    items: list[Item]
    scores: list[float | None] = field(default_factory=list)
    error: str | None = None


class RemoteReward:
    """A reward function served over HTTP; ``fn(prompts, completions, **fields) -> list[float]``."""

    def __init__(self, name: str, endpoint: ScoreEndpoint | JudgeEndpoint, settings: RemoteSettings) -> None:
        self.__name__ = name
        self.endpoint = endpoint
        self.settings = settings
        self._send = tuple(dict.fromkeys([*settings.fields, *getattr(endpoint, "fields", ())]))
        self._cache: OrderedDict[str, float] = OrderedDict()
        self._lock = threading.Lock()
        self._client: httpx.Client | None = None
        self._closer: weakref.finalize | None = None

    def __repr__(self) -> str:
        return f"RemoteReward({self.__name__!r}, {self.settings.url!r}, on_failure={self.settings.on_failure!r})"

    # -- the reward function ---------------------------------------------------------------

    def __call__(self, prompts: Sequence[str], completions: Sequence[str], **fields: Sequence[object]) -> Scores:
        missing = [name for name in self._send if name not in fields]
        if missing:
            raise ValueError(
                f"remote reward {self.__name__!r} sends field {missing[0]!r}, which the task does not give; "
                f"it gives: {', '.join(sorted(fields)) or 'none'}"
            )
        deadline = time.monotonic() + self.settings.step_timeout_s
        counts = dict.fromkeys(COUNTERS, 0.0)  # this call's own: overlapping calls (max_staleness >= 2) each count theirs
        items = [(p, c, {name: fields[name][i] for name in self._send}) for i, (p, c) in enumerate(zip(prompts, completions))]
        scores: list[float | None] = [None] * len(items)
        errors: dict[int, str] = {}
        keys = [json.dumps(item, sort_keys=True, default=str) for item in items]
        todo = []
        with self._lock:
            for i, key in enumerate(keys):
                if key in self._cache:
                    scores[i] = self._cache[key]
                    self._cache.move_to_end(key)
                    counts["cache_hits"] += 1
                else:
                    todo.append(i)
        size = self.endpoint.batch_size
        units = [_Unit(todo[k : k + size], [items[i] for i in todo[k : k + size]]) for k in range(0, len(todo), size)]
        outcomes = self._run_units(units, deadline, counts)
        for unit, (unit_scores, unit_error) in zip(units, outcomes):
            for slot, i in enumerate(unit.indices):
                score = unit_scores[slot] if unit_error is None else None
                if score is None:
                    errors[i] = unit_error or "the server declined to score it (null)"
                else:
                    scores[i] = score
                    self._remember(keys[i], score)
        final = self._apply_policy(scores, errors, prompts, completions, counts)
        return Scores(final, {f"rewards/{self.__name__}/{key}": value for key, value in counts.items()})

    def _apply_policy(self, scores: list[float | None], errors: dict[int, str], prompts: Sequence[str],
                      completions: Sequence[str], counts: dict[str, float]) -> list[float]:
        with self._lock:
            counts["failed"] += len(errors)
        if errors and self.settings.on_failure == "stop":
            first = min(errors)
            shown = completions[first] if len(completions[first]) <= 60 else completions[first][:57] + "..."
            raise RemoteRewardError(
                f"remote reward {self.__name__!r} ({self.settings.url}) gave no score to {len(errors)} of "
                f"{len(scores)} completions (on_failure=stop); completion {first} {shown!r}: {errors[first]}"
            )
        failed = set(errors)
        if self.settings.on_failure == "skip":
            starts = [i for i in range(len(prompts)) if i == 0 or prompts[i] != prompts[i - 1]]
            for start, end in zip(starts, [*starts[1:], len(prompts)]):
                if failed & set(range(start, end)):
                    failed |= set(range(start, end))
                    with self._lock:
                        counts["skipped_groups"] += 1
        with self._lock:
            counts["fallback"] += len(failed)
        fallback = float(self.settings.fallback)
        return [fallback if i in failed or score is None else score for i, score in enumerate(scores)]

    def _remember(self, key: str, score: float) -> None:
        if self.settings.cache_size == 0:
            return
        with self._lock:
            self._cache[key] = score
            while len(self._cache) > self.settings.cache_size:
                self._cache.popitem(last=False)

    # -- requests --------------------------------------------------------------------------

    def _run_units(
        self, units: list[_Unit], deadline: float, counts: dict[str, float]
    ) -> list[tuple[list[float | None], str | None]]:
        """Each unit's (scores, error) by the deadline; one still out then gets an error (its
        thread may finish later: what it writes is no longer read)."""
        if not units:
            return []
        pool = concurrent.futures.ThreadPoolExecutor(max_workers=min(self.settings.concurrency, len(units)),
                                                     thread_name_prefix=f"reward-{self.__name__}")
        try:
            futures = [pool.submit(self._request, unit, deadline, counts) for unit in units]
            done, _ = concurrent.futures.wait(futures, timeout=max(0.0, deadline - time.monotonic()))
            outcomes: list[tuple[list[float | None], str | None]] = []
            for future, unit in zip(futures, units):
                if future not in done:
                    outcomes.append(([], f"no reply within the step's {self.settings.step_timeout_s:g} s (step_timeout_s)"))
                elif future.exception() is not None:  # a bug here, not the server's: say so
                    outcomes.append(([], f"{type(future.exception()).__name__}: {future.exception()}"))
                else:
                    outcomes.append((unit.scores, unit.error))
            return outcomes
        finally:
            # threads still waiting end by their own (deadline-capped) timeouts; nothing waits for them
            pool.shutdown(wait=False, cancel_futures=True)

    def client(self) -> httpx.Client:
        with self._lock:
            if self._client is None:
                key = os.environ.get(self.settings.api_key_env) if self.settings.api_key_env else None
                self._client = httpx.Client(
                    limits=httpx.Limits(max_connections=self.settings.concurrency,
                                        max_keepalive_connections=self.settings.concurrency),
                    headers={"Authorization": f"Bearer {key}"} if key else None,
                    # plain http needs no TLS context, whose CA bundle takes ~0.2 s to load
                    verify=self.settings.url.startswith("https://"),
                )
                # its sockets are closed when this reward is dropped, not left to the garbage collector
                self._closer = weakref.finalize(self, self._client.close)
            return self._client

    def close(self) -> None:
        """Close the connection pool (a later call opens a new one)."""
        with self._lock:
            self._client = None
            closer, self._closer = self._closer, None
        if closer is not None:
            closer()

    def __enter__(self) -> RemoteReward:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _post(self, body: object, deadline: float, timeout_s: float) -> _Reply:
        """POST `body` and read the reply by `deadline`; the connection goes back to the pool (or is closed,
        when the reply was cut off) before this returns."""
        with self.client().stream("POST", self.settings.url, json=body, timeout=timeout_s) as reply:
            return _read_by(reply, deadline)

    def _count(self, counts: dict[str, float], name: str, amount: float = 1.0) -> None:
        with self._lock:  # the counts of the call that sent the request, even if it has returned
            counts[name] += amount

    def _request(self, unit: _Unit, deadline: float, counts: dict[str, float]) -> None:
        """POST the unit, retrying what may pass on a retry; sets unit.scores or unit.error."""
        body = self.endpoint.body(unit.items)
        attempts = self.settings.retries + 1
        for attempt in range(attempts):
            left = deadline - time.monotonic()
            if left <= 0:
                unit.error = unit.error or "the step's deadline passed before a request went out"
                return
            start = time.monotonic()
            self._count(counts, "requests")
            wait: float | None = None
            try:
                reply = self._post(body, deadline, min(self.settings.timeout_s, left))
            except (httpx.TransportError, _Overdue) as e:  # connect/read/write/pool timeouts, refused connections
                self._count(counts, "latency_s", time.monotonic() - start)
                unit.error = f"{type(e).__name__} after {attempt + 1} attempt(s): {e or 'no detail'}"
            else:
                self._count(counts, "latency_s", time.monotonic() - start)
                if reply.status_code == 200:
                    try:
                        unit.scores = self.endpoint.scores(json.loads(reply.content), len(unit.items))
                        unit.error = None
                    except ReplyError as e:
                        unit.error = str(e)
                    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
                        unit.error = f"the reply is not JSON ({e}): {reply.text[:80]!r}"
                    return
                unit.error = f"HTTP {reply.status_code} after {attempt + 1} attempt(s): {reply.text[:80]!r}"
                if reply.status_code not in _RETRY_STATUS:
                    return
                wait = _retry_after(reply.headers.get("retry-after"))
            if attempt + 1 == attempts:
                return
            if wait is None:
                wait = self.settings.backoff_s * 2**attempt * random.uniform(0.5, 1.0)  # noqa: S311 - jitter
            wait = min(wait, self.settings.max_backoff_s)
            if time.monotonic() + wait >= deadline:
                return  # waiting would pass the deadline: fail now with the last error
            self._count(counts, "retries")
            time.sleep(wait)


class _Overdue(Exception):
    """A reply still arriving at the step's deadline (a server trickling its bytes): closed, not waited for."""


@dataclass(frozen=True)
class _Reply:
    """What a request got back: read whole by the deadline."""

    status_code: int
    headers: httpx.Headers
    content: bytes

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", errors="replace")


def _read_by(reply: httpx.Response, deadline: float) -> _Reply:
    """`reply` read whole, giving up at `deadline`: each read is bounded by the read timeout, but a server
    that sends a byte now and then resets that timeout forever and would hold the pooled connection."""
    chunks = []
    for chunk in reply.iter_bytes():
        chunks.append(chunk)
        if time.monotonic() >= deadline:
            raise _Overdue(f"the reply was still arriving at the step's deadline ({sum(map(len, chunks))} bytes read)")
    return _Reply(reply.status_code, reply.headers, b"".join(chunks))


def _retry_after(value: str | None) -> float | None:
    """Seconds from a Retry-After header: delay-seconds (RFC 9110 10.2.3; a decimal is read too) or an HTTP date."""
    if value is None:
        return None
    value = value.strip()
    if re.fullmatch(r"\d{1,9}(?:\.\d{1,9})?", value):
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def _split(options: Mapping[str, Any], endpoint_type: type) -> tuple[dict[str, Any], dict[str, Any]]:
    """Keyword options into (endpoint's, settings'); an unknown one raises naming all known."""
    own = set(endpoint_type.__dataclass_fields__)
    shared = set(RemoteSettings.__dataclass_fields__)
    unknown = sorted(set(options) - own - shared)
    if unknown:
        raise ValueError(f"unknown option {unknown[0]!r}; known: {', '.join(sorted(own | shared))}")
    return {k: v for k, v in options.items() if k in own}, {k: v for k, v in options.items() if k in shared}


def remote_score(*, reward_name: str = "remote_score", **options: Any) -> RemoteReward:
    """A JSON scoring service (``ScoreEndpoint``: batch_size) with ``RemoteSettings`` (url, ...);
    ``reward_name``: the function's name, which its metrics carry."""
    mine, settings = _split(options, ScoreEndpoint)
    return RemoteReward(reward_name, ScoreEndpoint(**mine), RemoteSettings(**settings))


def remote_judge(*, reward_name: str = "remote_judge", **options: Any) -> RemoteReward:
    """A chat-completions judge (``JudgeEndpoint``: model, template, verdict...) with ``RemoteSettings``;
    ``reward_name``: the function's name, which its metrics carry."""
    mine, settings = _split(options, JudgeEndpoint)
    return RemoteReward(reward_name, JudgeEndpoint(**mine), RemoteSettings(**settings))
