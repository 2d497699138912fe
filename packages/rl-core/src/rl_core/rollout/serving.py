"""The paged engine serving requests that arrive while it runs (the OpenAI endpoint's engine).

`EngineLoop` owns a `PagedBackend` on one thread. Callers on any thread `submit` a `Job` (one
prompt's token ids, sampled `num_samples` times, with its own limit, stop strings and optional
seed and session handle) and get a `concurrent.futures.Future` of its samples. The loop admits
every waiting job with the same sampling parameters between two device calls into one
`rl_core.rollout.scheduler.HostLoop` (the loop training rollouts run too), so concurrent requests
share the continuous batching of one rollout: a job that arrives while others decode starts at
the next call, not after them. Jobs with other sampling parameters (another compiled program)
wait until the running ones finish.

Each sample draws with its own key, fold_in(fold_in(loop key, prompt id), sample index), as in a
rollout (rl_core.rollout.step.completion_keys): a job with a `seed` takes it as its prompt id, so
the same seed, prompt and weights give the same tokens whatever else runs beside it.

A sample ends at an end-of-sequence token, its job's limit, or soon after a stop string (the
engine may decode up to k - 1 tokens past it: `Sample.tokens` is cut just after the token that
completes the stop string, as `finish` reports). A job with a session handle leaves its sequence
retained for a next job continuing it (rl_core.rollout.retained). Weights change between
rollouts (`update_weights`), or, on an engine with partial rollouts, at the next device call
after one is published to its feed (`PagedBackend.publish`: each token records the version that
sampled it, `recompute` recomputes what the pages hold). Any exception inside a rollout fails
every job of it, frees every page, and the loop goes on with the next jobs.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import jax
import numpy as np

from rl_core.rollout.records import PromptRecord, SampleRecord, prompt_record
from rl_core.rollout.sampler import SamplingParams
from rl_core.rollout.scheduler import HostLoop

if TYPE_CHECKING:
    from rl_core.rollout.paged import PagedBackend

SEED_IDS = 1 << 30
"""Prompt ids below this are seeds (`Job.seed` mod SEED_IDS); unseeded jobs count from here."""


class Sample(NamedTuple):
    """One finished sample of a job."""

    tokens: list[int]
    """Its new token ids: through the end-of-sequence token, or the token completing a stop string."""
    logp: list[float]
    """The sampler's log-prob of each token (under the whole tempered softmax)."""
    version: int
    """The weight version that sampled its first token (a later one may sample the rest on an engine
    with partial rollouts)."""
    finish: str
    """"stop" (an end-of-sequence token or a stop string) or "length" (the job's limit)."""
    top: Sequence[tuple[list[int], list[float]]] = ()
    """Per token, the engine's `top_logprobs` likeliest tokens and their log-probs (empty when it computes none)."""
    routing: np.ndarray | None = None
    """[tokens, layers, k]: the experts each layer's router chose for each token (a mixture of experts;
    None for a dense model), as a rollout's `Completions.routing` holds them."""


@dataclasses.dataclass(eq=False)
class Job:
    """One prompt's request to the loop."""

    tokens: Sequence[int]
    """The prompt's token ids."""
    sampling: SamplingParams
    num_samples: int = 1
    max_new_tokens: int = 0
    """Most new tokens of each sample; 0: the engine's max_new_tokens (larger values are capped there)."""
    stops: tuple[str, ...] = ()
    seed: int | None = None
    session: int = -1
    """A session handle (`PagedBackend.new_sessions`): continue what it holds, and hold the sequence after."""
    on_tokens: Callable[[int, list[int]], None] | None = None
    """Called on the loop's thread after each device call that gave sample j new tokens: (j, its tokens so far)."""
    future: concurrent.futures.Future = dataclasses.field(default_factory=concurrent.futures.Future)
    _samples: list[SampleRecord] = dataclasses.field(default_factory=list)
    _seen: list[int] = dataclasses.field(default_factory=list)


class EngineLoop:
    """Serves `Job`s on one thread with `engine` (a PagedBackend holding weights); see the module docstring."""

    def __init__(self, engine: PagedBackend, decode: Callable[[list[int]], str], *, key: jax.Array | None = None,
                 linger_s: float = 0.005, linger_max_s: float = 0.05) -> None:
        """`linger_s`, `linger_max_s`: an idle engine woken by a job waits while more keep coming, each
        within `linger_s` of the last, `linger_max_s` at most, so that a burst of requests starts as one
        rollout (as a batching server's queue delay): a job arriving once a device call has started
        waits for that call (k decode steps), which costs a burst's last job a whole call."""
        if engine.weights is None:
            raise RuntimeError("EngineLoop needs an engine holding weights (update_weights first)")
        self.engine, self.decode = engine, decode
        self.key = jax.random.key(0) if key is None else key
        self.linger_s, self.linger_max_s = linger_s, linger_max_s
        self._inbox: queue.Queue[Any] = queue.Queue()
        self._waiting: collections.deque[Job] = collections.deque()
        self._commands: list[Callable[[], None]] = []
        self._unseeded = 0
        self._closed = False
        self._abandon = False  # close(abandon=True): the running rollout's jobs fail at the next device call
        self._stopping = False  # the loop's thread took the close request
        self.calls = 0  # device calls made
        self.rollouts = 0  # busy periods of one sampling setting
        self._thread = threading.Thread(target=self._run, name="engine-loop", daemon=True)
        self._thread.start()

    # -- callers' side (any thread) ------------------------------------------------------------

    def submit(self, job: Job) -> concurrent.futures.Future:
        """Queue `job`; its future gets the list of its `num_samples` Samples (or the exception that failed it)."""
        if self._closed:
            raise RuntimeError("the engine loop is closed")
        self._inbox.put(job)
        return job.future

    def generate(self, job: Job) -> list[Sample]:
        """`submit` and wait."""
        return self.submit(job).result()

    def call(self, fn: Callable[[], Any]) -> Any:
        """Run `fn()` on the loop's thread when no rollout runs (new weights, releasing sessions), and
        return its result."""
        done: concurrent.futures.Future = concurrent.futures.Future()

        def command() -> None:
            try:
                done.set_result(fn())
            except BaseException as e:  # noqa: BLE001 - handed to the caller
                done.set_exception(e)

        self._inbox.put(command)
        return done.result()

    def update_weights(self, params: Any, version: int) -> None:
        """New weights for the following rollouts (the running ones finish with the old)."""
        self.call(lambda: self.engine.update_weights(params, version))

    def close(self, *, abandon: bool = False) -> None:
        """Stop the thread after the running rollout, or with `abandon` after its device call (its jobs
        fail: a server that stops answers its open requests at once); waiting jobs fail."""
        if self._closed:
            return
        self._closed = True
        self._abandon = abandon
        self._inbox.put(None)
        self._thread.join()

    # -- the loop's thread -----------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stopping:
            idle = not self._waiting
            if not self._take(block=idle):
                break
            if idle and self._waiting and not self._linger():
                break
            for command in self._commands:
                command()
            self._commands.clear()
            if self._waiting:
                self._rollout(self._waiting[0].sampling)
        for command in self._commands:  # a caller waits on each
            command()
        for job in self._waiting:
            job.future.set_exception(RuntimeError("the engine loop closed before this request ran"))

    def _take(self, *, block: bool) -> bool:
        """Move the inbox into the waiting jobs and commands (waiting for one item when `block`);
        False once closed."""
        try:
            item = self._inbox.get(block=block)
        except queue.Empty:
            return True
        while self._sort(item):
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return True
        return False

    def _sort(self, item: Any) -> bool:
        """File one inbox item: a job waits, a command runs between rollouts; None closes (False)."""
        if item is None:
            self._stopping = True
            return False
        (self._waiting if isinstance(item, Job) else self._commands).append(item)
        return True

    def _linger(self) -> bool:
        """Take the jobs of a burst that is still arriving (see `__init__`); False once closed."""
        end = time.perf_counter() + self.linger_max_s
        while (left := end - time.perf_counter()) > 0:
            try:
                item = self._inbox.get(timeout=min(self.linger_s, left))
            except queue.Empty:
                return True
            if not self._sort(item) or not self._take(block=False):
                return False
        return True

    def _rollout(self, sampling: SamplingParams) -> None:
        """One busy period: device calls while any job with `sampling` waits or runs, admitting new ones."""
        running: list[Job] = []
        self.rollouts += 1
        loop: HostLoop | None = None
        try:
            with HostLoop(self.engine, sampling, self.key, decode=self.decode) as loop:
                while True:
                    if not self._take(block=False):
                        self._stopping = True  # finish this rollout first, unless abandoned
                        if self._abandon and running:
                            raise RuntimeError("the engine loop closed before this request finished")
                        if self._abandon:  # the waiting jobs fail as the thread ends
                            break
                    self._admit(loop, running, sampling)
                    if not running:
                        break
                    loop.step()
                    self.calls += 1
                    running[:] = [job for job in running if not self._progress(job)]
        except BaseException as e:  # a host loop that started reset the engine
            if loop is None:  # it could not start (no pool, no program): the jobs waiting for it fail
                running = [job for job in self._waiting if job.sampling == sampling
                           and job.future.set_running_or_notify_cancel()]
                self._waiting = collections.deque(job for job in self._waiting if job.sampling != sampling)
            for job in running:
                job.future.set_exception(e)
            if not running and isinstance(e, Exception):  # no job to tell: a bookkeeping bug after the last one
                logging.getLogger(__name__).error("the engine loop's rollout failed after its jobs", exc_info=e)
            if not isinstance(e, Exception):
                raise

    def _admit(self, loop: HostLoop, running: list[Job], sampling: SamplingParams) -> None:
        """Start every waiting job with `sampling`, each on the replica holding its session or the least busy."""
        later: collections.deque[Job] = collections.deque()
        while self._waiting:
            job = self._waiting.popleft()
            if job.sampling != sampling:
                later.append(job)
                continue
            if not job.future.set_running_or_notify_cancel():
                continue
            try:
                prompt = self._prompt(job)
                loop.admit([prompt])
            except ValueError as e:
                job.future.set_exception(e)
                continue
            if job.seed is None:  # only an admitted job takes an unseeded id
                self._unseeded = (self._unseeded + 1) % SEED_IDS
            job._samples, job._seen = prompt.samples, [0] * job.num_samples
            running.append(job)
        self._waiting = later

    def _prompt(self, job: Job) -> PromptRecord:
        """`job` as a prompt record keyed by its seed (else the next unseeded prompt id); a ValueError
        when the engine cannot take it."""
        s = self.engine.settings
        limit = s.max_new_tokens if job.max_new_tokens <= 0 else min(job.max_new_tokens, s.max_new_tokens)
        pid = int(job.seed) % SEED_IDS if job.seed is not None else SEED_IDS + self._unseeded
        prompt = prompt_record(np.asarray(job.tokens, np.int32), s, name="the prompt", prompt_id=pid,
                               num_samples=max(job.num_samples, 0), limit=limit, stops=job.stops,
                               sessions=[job.session] * max(job.num_samples, 0))
        if job.num_samples < 1:
            raise ValueError(f"num_samples = {job.num_samples}: must be >= 1")
        if job.session >= 0 and job.num_samples > 1:
            raise ValueError(f"a job with a session has one sample, not {job.num_samples}")
        return prompt

    def _progress(self, job: Job) -> bool:
        """Stream `job`'s new tokens; resolve it when every sample ended (True)."""
        samples = job._samples
        if job.on_tokens is not None:
            for j, sample in enumerate(samples):
                if len(sample.tokens) > job._seen[j]:
                    job._seen[j] = len(sample.tokens)
                    job.on_tokens(j, self._cut_at_stop(job, list(sample.tokens))[0])
        if not all(x.done for x in samples):
            return False
        out = []
        for sample in samples:
            tokens, stopped = self._cut_at_stop(job, list(sample.tokens))
            ended = stopped or (bool(tokens) and tokens[-1] in self.engine.eos_ids)
            version = sample.versions[0] if sample.versions else self.engine.version
            routing = np.stack(sample.routing[: len(tokens)]) if sample.routing and tokens else None
            out.append(Sample(tokens, list(sample.logp[: len(tokens)]), version, "stop" if ended else "length",
                              list(sample.top[: len(tokens)]), routing))
        job.future.set_result(out)
        return True

    def _cut_at_stop(self, job: Job, tokens: list[int]) -> tuple[list[int], bool]:
        return cut_at_stop(tokens, job.stops, self.decode)


def cut_at_stop(tokens: list[int], stops: Sequence[str], decode: Callable[[list[int]], str]) -> tuple[list[int], bool]:
    """(the tokens up to the one completing a stop string (all when none holds one), whether one did)."""
    if not stops or not any(stop in decode(tokens) for stop in stops):
        return tokens, False
    lo, hi = 1, len(tokens)  # the fewest leading tokens whose text holds a stop (texts only grow)
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if any(stop in decode(tokens[:mid]) for stop in stops) else (mid + 1, hi)
    return tokens[:lo], True


__all__ = ["EngineLoop", "Job", "Sample", "cut_at_stop"]
