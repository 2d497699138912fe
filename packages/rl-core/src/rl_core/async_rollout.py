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
from typing import TYPE_CHECKING, Any, Generic, NamedTuple, TypeVar

import jax

from rl_core.faults import fault_point
from rl_core.types import TrainExample

if TYPE_CHECKING:
    from rl_core.learner import RLLearner, StepBatch

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

    @classmethod
    def for_learner(cls, learner: RLLearner, *, splits: bool) -> RolloutThread | None:
        """The learner's rollout thread for `training.async_rollout` (None when off; in line in a
        multi-process run); `splits`: whether the learner has produce_examples' two halves."""
        mode = learner.training.async_rollout
        if mode == "off":
            return None
        if not splits:
            raise ValueError(f"training.async_rollout = {mode!r}: {type(learner).__name__} implements "
                             "produce_examples only, not its halves collect / examples_from / batch_to_json / "
                             "batch_from_json that async rollouts run apart")
        return cls(threaded=jax.process_count() == 1)

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


def batch_ahead(learner: RLLearner) -> tuple[StepBatch, Callable[[], InFlight]]:
    """This step's batch (collected during the last step, or now on the first) as examples under
    the current weights, and the collection of the next batch with these weights pinned, to run
    beside the update (`update_beside`)."""
    n = learner.training.prompts_per_step
    if learner.in_flight is None:  # the first step, or a resume from a synchronous run's checkpoint
        learner.in_flight = InFlight(learner.collect(learner.data.next(n)), learner.step)
    batch = learner.examples_from(learner.in_flight.batch)
    staleness = float(learner.step - learner.in_flight.version)
    batch = batch._replace(metrics={**batch.metrics, "async/staleness": staleness})
    prompts, version = learner.data.next(n), learner.step
    learner.rollouts.pin(version)

    def collect_next() -> InFlight:
        collected = learner.collect(prompts)
        fault_point("in_flight", learner.step + 1)  # the next batch collected, the update maybe not done
        return InFlight(collected, version)

    return batch, collect_next


def update_beside(learner: RLLearner, example: TrainExample, collect_next: Callable[[], InFlight]
                  ) -> tuple[dict[str, list[dict[str, Any]]], dict[str, float]]:
    """The update on `example` with `collect_next` beside it; the update's statistics and the
    waits. The batch collected is then in flight, and the rollouts follow the policy again."""
    try:
        both = learner.ahead.beside(collect_next, lambda: learner.update_models(example))
    finally:
        learner.rollouts.unpin()  # evaluation and export sample with the current weights
    learner.in_flight = both.side
    return both.main, {"time/wait_rollout": both.wait_rollout, "time/wait_update": both.wait_update}
