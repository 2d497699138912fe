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

`batch_ahead` and `update_beside` are functions of what they are given (the collect and
examples functions, the batch in flight, the `Supply` of prompts, carry and key, the
weights to pin, the rollout thread) and return new values: the batch in flight and the
supply past it. The learner keeps them in its state; nothing here writes the learner.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, NamedTuple, Protocol

import jax

from rl_core.data import Prompt, Supply
from rl_core.run.faults import fault_point
from rl_core.types import StepBatch, TrainExample


class CollectHalves:
    """What a learner implements for async rollouts (RLLearner inherits these defaults):
    `produce_examples` in two halves, and the JSON form of the half-way batch for the
    checkpoint of the batch in flight. A learner without them runs synchronously only."""

    def collect(self, prompts: Sequence[Prompt], supply: Supply) -> tuple[Any, Supply]:
        """The rollout half: sample (through `generate`, which uses the pinned weights) and score;
        returns the batch and `supply` as the collection leaves it (more prompts drawn, the
        algorithm's carry). It runs beside the update: it must not read the trained parameters
        nor write what `examples_from` reads."""
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
        self._running: Future | Callable[[], Any] | None = None
        self._done_at = 0.0

    @classmethod
    def for_mode(cls, mode: str) -> RolloutThread | None:
        """The rollout thread for `training.async_rollout = mode` (None when off; in line in a
        multi-process run)."""
        return None if mode == "off" else cls(threaded=jax.process_count() == 1)

    def start(self, collect: Callable[[], Any]) -> None:
        """Begin `collect()` on the rollout thread (in line: it runs in `finish`)."""
        if self._pool is None:
            self._running = collect
            return

        def timed() -> Any:
            try:
                return collect()
            finally:
                self._done_at = time.perf_counter()

        self._running = self._pool.submit(timed)

    def finish(self) -> tuple[Any, dict[str, float]]:
        """What the collection returned, once done, and the waits: `time/wait_rollout`, seconds this
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


class Pinning(Protocol):
    """Where rollouts sample (rl_core.rollout.generation.PolicyGenerator): weights pinned for a collection."""

    def pin(self, version: int, params: Any) -> None: ...

    def unpin(self) -> None: ...


def batch_ahead(*, collect: Callable[[Sequence[Prompt], Supply], tuple[Any, Supply]],
                examples_from: Callable[[Any], StepBatch], in_flight: InFlight | None, supply: Supply,
                prompts_per_step: int, version: int, params: Any, generator: Pinning, thread: RolloutThread
                ) -> StepBatch:
    """This step's batch as examples under the current weights `params` (step count `version`):
    `in_flight`, collected during the last step, or collected now from `supply` on the first
    step (or a resume from a synchronous run's checkpoint). Meanwhile the next batch is collected
    on `thread` from `supply` with these weights pinned in `generator`; `update_beside` then runs
    the update and returns it (InFlight) with the supply past it."""
    if in_flight is None:
        prompts, supply = supply.draw(prompts_per_step)
        collected, supply = collect(prompts, supply)
        in_flight = InFlight(collected, version)
    prompts, supply = supply.draw(prompts_per_step)
    generator.pin(version, params)

    def collect_next() -> tuple[InFlight, Supply]:
        collected, after = collect(prompts, supply)
        fault_point("in_flight", version + 1)  # the next batch collected, the update maybe not done
        return InFlight(collected, version), after

    thread.start(collect_next)
    try:
        batch = examples_from(in_flight.batch)  # the proximal log-prob pass runs beside the collection
    except BaseException:
        thread.abandon()
        generator.unpin()
        raise
    return batch._replace(metrics={**batch.metrics, "async/staleness": float(version - in_flight.version)})


def update_beside(update: Callable[[TrainExample], Any], example: TrainExample, *, generator: Pinning,
                  thread: RolloutThread) -> tuple[Any, InFlight, Supply, dict[str, float]]:
    """`update(example)` while the collection `batch_ahead` started goes on: what the update
    returned, the batch collected (now in flight), the supply past it and the waits. The
    rollouts follow the policy's weights again."""
    try:
        results = update(example)
        (in_flight, supply), waits = thread.finish()
    except BaseException:
        thread.abandon()
        raise
    finally:
        generator.unpin()  # the collection is over: evaluation and export use the current weights
    return results, in_flight, supply, waits
