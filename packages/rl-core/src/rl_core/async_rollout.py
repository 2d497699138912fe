"""One-step-off-policy rollouts: the next batch is collected while this one trains.

With `training.async_rollout = "one_step"` a step n of the learner

  1. pins the current weights W(n-1) in the rollout backend and starts collecting
     batch n+1 with them (generation, decoding, reward scoring) on a rollout thread,
  2. meanwhile turns the batch collected during step n-1 into train examples under
     W(n-1) (the proximal log-probs of decoupled PPO; advantages; metrics),
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
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, NamedTuple

import jax

from rl_core.data import Prompt
from rl_core.faults import fault_point
from rl_core.types import StepBatch, TrainExample

if TYPE_CHECKING:
    from rl_core.learner import RLLearner


class CollectHalves:
    """What a learner implements for async rollouts (RLLearner inherits these defaults):
    `produce_examples` in two halves, and the JSON form of the half-way batch for the
    checkpoint of the batch in flight. A learner without them runs synchronously only."""

    def collect(self, prompts: Sequence[Prompt]) -> Any:
        """The rollout half: sample (through `generate`, which uses the pinned weights) and score.
        It runs beside the update: it must not read the trained parameters nor write what
        `examples_from` reads."""
        raise NotImplementedError

    def examples_from(self, batch: Any) -> StepBatch:
        """The training half: what `collect` returned, as train examples under the current weights."""
        raise NotImplementedError

    def batch_to_json(self, batch: Any) -> Any:
        raise NotImplementedError

    def batch_from_json(self, data: Any) -> Any:
        raise NotImplementedError


class InFlight(NamedTuple):
    """A batch collected ahead of the step that trains on it."""

    batch: Any
    """What the learner's `collect` returned (GRPO: scored groups)."""
    version: int
    """The step count of the weights that sampled it (0: the initial weights)."""


class RolloutThread:
    """Runs one collection at a time beside the caller's work (or in line, `threaded=False`)."""

    def __init__(self, *, threaded: bool) -> None:
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="rollout") if threaded else None
        self._running: Future | Callable[[], InFlight] | None = None
        self._done_at = 0.0

    @classmethod
    def for_learner(cls, learner: RLLearner) -> RolloutThread | None:
        """The learner's rollout thread for `training.async_rollout` (None when off; in line in a
        multi-process run); the learner must implement `CollectHalves`."""
        mode = learner.training.async_rollout
        if mode == "off":
            return None
        if type(learner).collect is CollectHalves.collect:
            raise ValueError(f"training.async_rollout = {mode!r}: {type(learner).__name__} implements "
                             "produce_examples only, not its halves collect / examples_from / batch_to_json / "
                             "batch_from_json that async rollouts run apart")
        return cls(threaded=jax.process_count() == 1)

    def start(self, collect: Callable[[], InFlight]) -> None:
        """Begin `collect()` on the rollout thread (in line: it runs in `finish`)."""
        if self._pool is None:
            self._running = collect
            return

        def timed() -> InFlight:
            try:
                return collect()
            finally:
                self._done_at = time.perf_counter()

        self._running = self._pool.submit(timed)

    def finish(self) -> tuple[InFlight, dict[str, float]]:
        """The collected batch, once done, and the waits: `time/wait_rollout`, seconds this
        thread waited for it; `time/wait_update`, seconds it was done before this thread."""
        running, self._running = self._running, None
        if not isinstance(running, Future):  # in line, after the caller's work: a fixed dispatch order
            return running(), {"time/wait_rollout": 0.0, "time/wait_update": 0.0}
        ready = time.perf_counter()
        result = running.result()  # raises the collection's error here
        return result, {"time/wait_rollout": max(self._done_at - ready, 0.0),
                        "time/wait_update": max(ready - self._done_at, 0.0)}

    def abandon(self) -> None:
        """Wait for a collection that is no longer wanted (the step failed): none outlives it."""
        running, self._running = self._running, None
        if isinstance(running, Future):
            running.exception()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)


def batch_ahead(learner: RLLearner) -> StepBatch:
    """This step's batch (collected during the last step, or now on the first) as examples under
    the current weights, while the next batch is collected beside it with these weights pinned;
    `update_beside` then runs the update and takes the collection."""
    n = learner.training.prompts_per_step
    if learner.in_flight is None:  # the first step, or a resume from a synchronous run's checkpoint
        learner.in_flight = InFlight(learner.collect(learner.data.next(n)), learner.step)
    this = learner.in_flight
    prompts, version = learner.data.next(n), learner.step
    learner.rollouts.pin(version)

    def collect_next() -> InFlight:
        collected = learner.collect(prompts)
        fault_point("in_flight", learner.step + 1)  # the next batch collected, the update maybe not done
        return InFlight(collected, version)

    learner.ahead.start(collect_next)
    try:
        batch = learner.examples_from(this.batch)  # the proximal log-prob pass runs beside the collection
    except BaseException:
        learner.ahead.abandon()
        learner.rollouts.unpin()
        raise
    return batch._replace(metrics={**batch.metrics, "async/staleness": float(learner.step - this.version)})


def update_beside(learner: RLLearner, example: TrainExample) -> tuple[dict[str, list[dict[str, Any]]], dict[str, float]]:
    """The update on `example` while the collection `batch_ahead` started goes on; the update's
    statistics and the waits. The batch collected is then in flight, and the rollouts follow
    the policy's weights again."""
    try:
        results = learner.update_models(example)
        learner.in_flight, waits = learner.ahead.finish()
    except BaseException:
        learner.ahead.abandon()
        raise
    finally:
        learner.rollouts.unpin()  # the collection is over: evaluation and export use the current weights
    return results, waits
