"""One-step-off-policy rollouts: the next batch is collected while this one trains.

With `training.async_rollout = "one_step"` a step n of the learner

  1. turns the batch collected during step n-1 into train examples under the current
     weights W(n-1) (the proximal log-probs of decoupled PPO; advantages; metrics),
  2. pins W(n-1) in the rollout backend and starts collecting batch n+1 with it
     (generation, decoding, reward scoring) on a rollout thread,
  3. runs the update on batch n (W(n-1) -> W(n)) on the calling thread,
  4. waits for batch n+1, which is then "in flight": sampled by W(n-1), trained at
     step n+1 by W(n), one step stale, and saved in every checkpoint with its version.

Step 1 has no batch in flight: it collects batch 1 with W(0) first. Nothing else is
reordered: the prompt stream and the key stream are drawn in the same order as in a
synchronous run, so an async run equals a synchronous one whose rollouts use weights
one step older (tests/algos/test_algo_async_rollout.py builds that reference).

The thread overlaps what can overlap on the host: the update's device work runs while
the rollout thread generates (a host-driven engine), decodes and scores (reward
functions that wait on a process, a judge or a sandbox). In a multi-process run the
processes must issue their collective programs in one order, which two threads per
process cannot promise, so there the collection runs on the calling thread after the
update is dispatched (same results, less overlap).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Generic, NamedTuple, TypeVar

T = TypeVar("T")
U = TypeVar("U")


class InFlight(NamedTuple):
    """A batch collected ahead of the step that trains on it."""

    batch: Any
    """What the learner's `collect` returned (GRPO: scored groups)."""
    version: int
    """The step count of the weights that sampled it (0: the initial weights)."""


class Overlap(NamedTuple, Generic[T, U]):
    """The results of `beside` and who waited for whom."""

    main: T
    side: U
    wait_rollout: float
    """Seconds the calling thread waited for the rollout after its own work was done."""
    wait_update: float
    """Seconds the rollout was done before the calling thread's work."""


class RolloutThread:
    """Runs one collection at a time beside the caller's work (or in line, `threaded=False`)."""

    def __init__(self, *, threaded: bool) -> None:
        self.threaded = threaded
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="rollout") if threaded else None

    def beside(self, side: Callable[[], U], main: Callable[[], T]) -> Overlap[T, U]:
        """`side()` on the rollout thread while `main()` runs here; both results.

        An exception of either is raised here once both have finished, so the learner's
        state is never left with a collection still running.
        """
        if self._pool is None:  # in line: the update first, as its dispatch order is fixed
            out = main()
            return Overlap(out, side(), 0.0, 0.0)
        done_at: list[float] = []

        def timed() -> U:
            try:
                return side()
            finally:
                done_at.append(time.perf_counter())

        future = self._pool.submit(timed)
        try:
            out = main()
        except BaseException:
            future.exception()  # wait: the collection must not outlive the step
            raise
        main_done = time.perf_counter()
        result = future.result()
        wait_rollout = max(done_at[0] - main_done, 0.0)
        return Overlap(out, result, wait_rollout, max(main_done - done_at[0], 0.0))

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
