"""Off-policy rollouts up to k steps ahead: the batches ahead are collected while this one trains.

With `training.async_rollout = "one_step"` and `training.max_staleness = k` (1 by default)
the learner holds a bounded queue of up to k collected batches, oldest first, each with the
version of the weights that sampled it (`InFlight`; every row of a batch also records its own,
`Groups.versions`, as DAPO's carried groups are older than the batch). A step n of the learner

  1. pins the current weights W(n-1) in the rollout backend and starts collecting
     batch n+k with them on the rollout thread: generation and decoding, then scoring,
  2. meanwhile waits for the queue's oldest batch, batch n, to be scored, and turns it into
     train examples under W(n-1) (the proximal log-probs of decoupled PPO; advantages; metrics),
  3. runs the update on batch n (W(n-1) -> W(n)) on the calling thread (with partial
     rollouts, `rollout.partial_rollouts`, it then publishes W(n) to the generation still
     decoding, whose remaining tokens sample with it: rl_core.rollout.feed),
  4. waits for batch n+k's generation and appends it to the queue: sampled by W(n-1), trained
     at step n+k by W(n+k-1), k steps stale. Every checkpoint saves the queue with its versions.

Where the collection can be cut (`CollectHalves.scores_apart`: GRPO and every variant that
keeps the pipeline's collection), step 4 does not wait for the scoring: the rollout thread hands
it to a pool of k scoring threads and is free, and the batch stays in the queue as a `Future`
until step n+k needs it (step 2) or a checkpoint saves it (the learner waits for every scoring
first, so a checkpoint holds scored batches). So up to k batches are scored at once while later
ones generate and earlier ones train: a slow reward (a process, a judge, a sandbox, a remote
verifier) gets k steps to finish, not one. Only the scoring runs apart: generation threads the
prompt stream and the key stream (`Supply`) from one batch to the next, so it stays sequential
and the weights pinned for it are one collection's (the scorings in flight hold no weights),
unpinned when the step ends; evaluation and export then use the current weights. A collection
that needs its scores to go on (DAPO draws more prompts while groups come out uniform) runs
whole on the rollout thread and the step waits for it, as before: k > 1 then lets a batch train
later, not collect sooner. Reward functions must give the same scores whatever else runs: at
k > 1 several calls can overlap.

The first step fills the queue first: it collects batches 1..k with W(0) in line (as does a
resume from a checkpoint with fewer than k batches ahead; one with more trains them off
without collecting). Nothing else is reordered: the prompt stream and the key stream are drawn
in the same order as in a synchronous run, and a scoring's result does not depend on when it
runs, so an async run equals a synchronous one whose batch n is sampled by W(max(n-1-k, 0))
(tests/algos/test_algo_async_rollout.py builds that reference), the same numbers run to run.

The thread overlaps what can overlap on the host: the update's device work runs while
the rollout thread generates (a host-driven engine), decodes and scores (reward
functions that wait on a process, a judge or a sandbox). In a multi-process run the
processes must issue their collective programs in one order, which two threads per
process cannot promise, so there the collection (scoring included) runs on the calling
thread after the update is dispatched (same results, less overlap).

`batch_ahead` and `update_beside` are functions of what they are given (the collect, score and
examples functions, the queue in flight, the `Supply` of prompts, carry and key, the
weights to pin, the rollout thread) and return new values: the queue in flight and the
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
    """What async rollouts need of a learner beyond its step's two halves (`collect` and
    `examples_from`, rl_core.learner.base.RLLearner; a synchronous step runs them in line, an
    async one apart): the JSON form of the half-way batch for the checkpoint of the batch in
    flight (a learner without it runs synchronously only) and, optionally, the rollout half cut
    once more, generation apart from scoring (`scores_apart`)."""

    def batch_to_json(self, batch: Any) -> Any:
        raise NotImplementedError

    def batch_from_json(self, data: Any) -> Any:
        raise NotImplementedError

    def scores_apart(self) -> bool:
        """True when `collect(prompts, supply)` is `score_collected` of `collect_unscored`'s batch:
        nothing the collection draws depends on the scores, so scoring may run later, on a
        scoring thread. False by default (and for a collection that reads its scores, DAPO's)."""
        return False

    def collect_unscored(self, prompts: Sequence[Prompt], supply: Supply) -> tuple[Any, Supply]:
        """`collect` without the scoring: the unscored batch and the supply past it."""
        raise NotImplementedError

    def score_collected(self, batch: Any) -> Any:
        """`collect_unscored`'s batch scored, as `collect` returns it; on any thread, several at once."""
        raise NotImplementedError


class InFlight(NamedTuple):
    """A batch collected ahead of the step that trains on it."""

    batch: Any
    """What the learner's `collect` returned (GRPO: scored groups), or while its scoring runs
    on a scoring thread a `Future` of it (`settled` waits for it)."""
    version: int
    """The step count of the weights that sampled it (0: the initial weights)."""


def settled(queue: Sequence[InFlight]) -> tuple[InFlight, ...]:
    """`queue` with every batch still being scored waited for (a scoring's error raises here)."""
    return tuple(f._replace(batch=f.batch.result()) if isinstance(f.batch, Future) else f for f in queue)


class RolloutThread:
    """Runs one collection at a time beside the caller's work (or in line, `threaded=False`),
    and up to `scorers` scorings of collected batches beside both."""

    def __init__(self, *, threaded: bool, scorers: int = 1) -> None:
        self.threaded = threaded
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="rollout") if threaded else None
        self._scorers = ThreadPoolExecutor(scorers, thread_name_prefix="scoring") if threaded else None
        self._running: Future | Callable[[], Any] | None = None
        self._done_at = 0.0

    @classmethod
    def for_mode(cls, mode: str, *, scorers: int = 1) -> RolloutThread | None:
        """The rollout thread for `training.async_rollout = mode` (None when off; in line in a
        multi-process run), with `scorers` scoring threads (training.max_staleness)."""
        return None if mode == "off" else cls(threaded=jax.process_count() == 1, scorers=scorers)

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

    def score(self, score: Callable[[], Any]) -> Future | Any:
        """`score()` on a scoring thread, its result to come (in line: its result now)."""
        return score() if self._scorers is None else self._scorers.submit(score)

    def finish(self) -> tuple[Any, dict[str, float]]:
        """What the collection returned, once done (None when none was started), and the waits:
        `time/wait_rollout`, seconds this thread waited for it; `time/wait_update`, seconds it was
        done before this thread."""
        running, self._running = self._running, None
        if running is None:
            return None, {"time/wait_rollout": 0.0, "time/wait_update": 0.0}
        if not isinstance(running, Future):  # in line, after the caller's work: a fixed dispatch order
            return running(), {"time/wait_rollout": 0.0, "time/wait_update": 0.0}
        ready = time.perf_counter()
        result = running.result()  # raises the collection's error here
        return result, {"time/wait_rollout": max(self._done_at - ready, 0.0),
                        "time/wait_update": max(ready - self._done_at, 0.0)}

    def abandon(self) -> None:
        """Wait for a collection that is no longer wanted (the step failed): none outlives it.
        Scorings already handed off belong to the queue: they finish on their own."""
        running, self._running = self._running, None
        if isinstance(running, Future):
            running.exception()

    def close(self) -> None:
        for pool in (self._pool, self._scorers):
            if pool is not None:
                pool.shutdown(wait=True)


class Pinning(Protocol):
    """Where rollouts sample (rl_core.rollout.generation.PolicyGenerator): weights pinned for a collection."""

    def pin(self, version: int, params: Any) -> None: ...

    def unpin(self) -> None: ...


def batch_ahead(*, collect: Callable[..., tuple[Any, Supply]],
                examples_from: Callable[[Any], StepBatch], in_flight: tuple[InFlight, ...], supply: Supply,
                prompts_per_step: int, version: int, params: Any, generator: Pinning, thread: RolloutThread,
                max_staleness: int = 1, score: Callable[[Any], Any] | None = None
                ) -> tuple[StepBatch, tuple[InFlight, ...]]:
    """This step's batch as examples under the current weights `params` (step count `version`),
    and the queue left behind it. The batch is the oldest of `in_flight`, the queue collected
    during earlier steps; a queue shorter than `max_staleness` (the first step, a resume from a
    synchronous run's checkpoint) is filled first from `supply`, in line. Meanwhile the next
    batch is collected on `thread` with these weights pinned in `generator`, unless the queue
    left holds `max_staleness` batches already (a resume with a smaller k); `update_beside`
    then runs the update and returns the queue with it and the supply past it.

    `score`: the collection's scoring half (`CollectHalves.score_collected`), when it can run
    apart; then `collect(prompts, supply, unscored=True)` generates and `thread` scores."""
    queue = tuple(in_flight)
    while len(queue) < max_staleness:
        prompts, supply = supply.draw(prompts_per_step)
        collected, supply = collect(prompts, supply)
        queue += (InFlight(collected, version),)
    head, rest = queue[0], queue[1:]
    if len(rest) < max_staleness:
        prompts, supply = supply.draw(prompts_per_step)
        generator.pin(version, params)

        def collect_next() -> tuple[InFlight, Supply]:
            if score is None:
                collected, after = collect(prompts, supply)
            else:  # generated here; scored on a scoring thread while the next batches generate
                unscored, after = collect(prompts, supply, unscored=True)
                collected = thread.score(lambda: score(unscored))
            fault_point("in_flight", version + 1)  # batch n+k generated, the update maybe not done
            return InFlight(collected, version), after

        thread.start(collect_next)
    try:
        waited = time.perf_counter()
        [head] = settled([head])  # its scoring, started k steps ago, may still run
        waited = time.perf_counter() - waited
        batch = examples_from(head.batch)  # the proximal log-prob pass runs beside the collection
    except BaseException:
        thread.abandon()
        generator.unpin()
        raise
    metrics = {**batch.metrics, "async/staleness": float(version - head.version),
               "async/sampled_version": float(head.version), "async/queue": float(len(rest)),
               "time/wait_scoring": waited}
    return batch._replace(metrics=metrics), rest


def update_beside(update: Callable[[TrainExample], Any], example: TrainExample, *, rest: tuple[InFlight, ...],
                  generator: Pinning, thread: RolloutThread, publish: Callable[[], Any] | None = None
                  ) -> tuple[Any, tuple[InFlight, ...], Supply | None, dict[str, float]]:
    """`update(example)` while the collection `batch_ahead` started goes on: what the update
    returned, the queue in flight (`rest`, what `batch_ahead` left, with the batch collected
    appended), the supply past it (None when no collection ran) and the waits. The rollouts
    follow the policy's weights again. `publish` (partial rollouts): called once the update
    returns, before the wait, to hand the new weights to the collection still decoding; not
    when the collection runs in line (a multi-process run), where it has not started yet."""
    try:
        results = update(example)
        if publish is not None and thread.threaded:
            publish()
        collected, waits = thread.finish()
    except BaseException:
        thread.abandon()
        raise
    finally:
        generator.unpin()  # the collection is over: evaluation and export use the current weights
    if collected is None:
        return results, rest, None, waits
    in_flight, supply = collected
    return results, (*rest, in_flight), supply, waits
