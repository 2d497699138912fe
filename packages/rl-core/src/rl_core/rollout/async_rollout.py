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

Where the collection is cut (a `Collection` with `score`: GRPO and every variant that keeps
the pipeline's collection), step 4 does not wait for the scoring: the rollout thread hands
it to a pool of k scoring threads and is free, and the batch stays in the queue as a `Future`
until step n+k needs it (step 2) or a checkpoint saves it (the learner waits for every scoring
first, so a checkpoint holds scored batches). So up to k batches are scored at once while later
ones generate and earlier ones train: a slow reward (a process, a judge, a sandbox, a remote
verifier) gets k steps to finish, not one. Only the scoring runs apart: generation threads the
prompt stream and the key stream (`CollectionInputs`) from one batch to the next, so it stays sequential
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

A synchronous run uses the same `Collector` with `ahead` = 0: it collects the step's batch in
line (or trains first on batches an async run's checkpoint left in flight). `Collector.take` and
`Collector.finish` are given values (the `Collection`'s functions, the queue in flight, the
`CollectionInputs` of prompts, carry and key, the weights to pin) and return new ones: the queue in flight
and the supply past it. The learner keeps them in its state; nothing here writes the learner.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, NamedTuple, Protocol

import jax

from rl_core.data import CollectionInputs, Prompt
from rl_core.run.faults import fault_point


class Collection(NamedTuple):
    """How a learner collects a batch, as the functions a `Collector` calls (rl_core.learner.base
    builds it each step): `collect(prompts, supply)` returns the batch and the supply past it
    (prompts drawn, carry, key). With `score`, `collect` returns the batch unscored and
    `score(batch)` scores it, on any thread, several at once: nothing the collection draws depends
    on the scores (GRPO's; not DAPO's, which draws more prompts as the scores come in).
    `batch`: the batch's type, with `to_json()` and a classmethod `from_json`, which a
    checkpoint writes the batches in flight and the carry with (None: none; no async rollouts)."""

    collect: Callable[[Sequence[Prompt], CollectionInputs], tuple[Any, CollectionInputs]]
    score: Callable[[Any], Any] | None = None
    batch: type | None = None

    def collect_scored(self, prompts: Sequence[Prompt], supply: CollectionInputs) -> tuple[Any, CollectionInputs]:
        """The batch scored, in line, and the supply past it."""
        batch, supply = self.collect(prompts, supply)
        return (batch if self.score is None else self.score(batch)), supply


class InFlight(NamedTuple):
    """A batch collected ahead of the step that trains on it."""

    batch: Any
    """What the learner's `collect` returned (GRPO: scored groups), or while its scoring runs
    on a scoring thread a `Future` of it (`await_scoring` waits for it)."""
    version: int
    """The step count of the weights that sampled it (0: the initial weights)."""


def await_scoring(queue: Sequence[InFlight]) -> tuple[InFlight, ...]:
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


class Collector:
    """Where a step's batch is collected: now, in line (`ahead` = 0, synchronous rollouts), or up
    to `ahead` = k steps earlier, beside the updates, on `thread` with the weights pinned in
    `generator` (async rollouts). A step calls `take` (its batch; the next one started), then
    `finish` after its update (the queue and the supply past what was collected), or `abandon` on
    an error. It takes and returns values: the learner keeps the queue and the supply in its state."""

    def __init__(self, *, ahead: int, prompts_per_step: int, generator: Pinning,
                 thread: RolloutThread | None = None) -> None:
        self.ahead, self.prompts_per_step, self.generator, self.thread = ahead, prompts_per_step, generator, thread

    @classmethod
    def for_training(cls, training: Any, rollout: Any, generator: Pinning, *, learner: str, saves_batches: bool
                     ) -> Collector:
        """The collector of `training.async_rollout` and `max_staleness` (the rollout thread in line
        in a multi-process run), for a learner that `saves_batches` in checkpoints (or not)."""
        if training.async_rollout != "off" and not saves_batches:
            raise ValueError(f"training.async_rollout = {training.async_rollout!r}: {learner} has no JSON form of "
                             "a collected batch (its Collection's `batch` type), which the checkpoint of the "
                             "batches in flight holds")
        if rollout.partial_rollouts != "off" and training.async_rollout == "off":
            raise ValueError(f"rollout.partial_rollouts = {rollout.partial_rollouts!r}: needs "
                             "training.async_rollout='one_step' (a synchronous rollout never sees newer weights)")
        if training.async_rollout == "off":
            return cls(ahead=0, prompts_per_step=training.prompts_per_step, generator=generator)
        thread = RolloutThread(threaded=jax.process_count() == 1, scorers=training.max_staleness)
        return cls(ahead=training.max_staleness, prompts_per_step=training.prompts_per_step, generator=generator,
                   thread=thread)

    def take(self, collection: Collection, queue: Sequence[InFlight], supply: CollectionInputs, *, version: int,
             params: Any) -> tuple[InFlight, tuple[InFlight, ...], CollectionInputs, dict[str, float]]:
        """This step's batch (scored), the queue behind it, the supply past what was drawn and the
        metrics of where the batch came from. The batch is the oldest of `queue` (collected by
        earlier steps); a queue shorter than `ahead` (at least one) is filled first, in line, with
        the current weights (step count `version`). With `ahead`, the next batch then starts on the
        rollout thread with `params` pinned, unless the queue left holds `ahead` batches already
        (a resume with a smaller k)."""
        queue = tuple(queue)
        while len(queue) < max(self.ahead, 1):
            prompts, supply = supply.draw(self.prompts_per_step)
            collected, supply = collection.collect_scored(prompts, supply)
            queue += (InFlight(collected, version),)
        head, rest = queue[0], queue[1:]
        if self.thread is not None and len(rest) < self.ahead:
            prompts, supply = supply.draw(self.prompts_per_step)
            self.generator.pin(version, params)
            self.thread.start(lambda: self._collect_next(collection, prompts, supply, version))
        waited = time.perf_counter()
        [head] = await_scoring([head])  # its scoring, started k steps ago, may still run
        metrics = {"rollout/staleness_version_lag": float(version - head.version)}
        if self.thread is not None:
            metrics |= {"async/staleness": float(version - head.version), "async/sampled_version": float(head.version),
                        "async/queue": float(len(rest)), "time/wait_scoring": time.perf_counter() - waited}
        return head, rest, supply, metrics

    def _collect_next(self, collection: Collection, prompts: Sequence[Prompt], supply: CollectionInputs, version: int
                      ) -> tuple[InFlight, CollectionInputs]:
        if collection.score is None:
            collected, after = collection.collect(prompts, supply)
        else:  # generated here; scored on a scoring thread while the next batches generate
            unscored, after = collection.collect(prompts, supply)
            collected = self.thread.score(lambda: collection.score(unscored))
        fault_point("in_flight", version + 1)  # batch n+k generated, the update maybe not done
        return InFlight(collected, version), after

    def finish(self, rest: tuple[InFlight, ...], supply: CollectionInputs, *, publish: tuple[int, Any] | None = None
               ) -> tuple[tuple[InFlight, ...], CollectionInputs, dict[str, float]]:
        """After the update: the queue in flight (`rest` with the batch collected beside the update
        appended), the supply past it and the waits. `publish` (partial rollouts): the new weights
        (version, params), handed to the collection still decoding before the wait; not when the
        collection runs in line, where it has not started yet. The rollouts then follow the
        policy's weights again."""
        if self.thread is None:
            return rest, supply, {}
        try:
            if publish is not None and self.thread.threaded:
                self.generator.publish(*publish)
            collected, waits = self.thread.finish()
        finally:
            self.generator.unpin()  # the collection is over: evaluation and export use the current weights
        if collected is None:
            return rest, supply, waits
        in_flight, supply = collected
        return (*rest, in_flight), supply, waits

    def abandon(self) -> None:
        """Wait for a collection the failed step started (none outlives it) and unpin its weights."""
        if self.thread is not None:
            self.thread.abandon()
            self.generator.unpin()

    def close(self) -> None:
        if self.thread is not None:
            self.thread.close()
