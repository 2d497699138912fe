"""The paged engine's host loop: one loop for training rollouts and for the server.

`HostLoop` drives an engine (anything with the reads of `LoopEngine`: rl_core.rollout.paged's
`PagedBackend`) through device calls. Prompts (`rl_core.rollout.records.PromptRecord`) are
`admit`ted between calls to one of the engine's R data replicas (rl_core.rollout.replica: each
its own page pool and S slots; one call advances them all): a prompt continuing a retained
sequence to the replica holding it, with the pages it reuses taken; else to the replica its
caller names (a rollout deals prompt i to replica i mod R) or the least busy. Each `step` first
takes weights published to the engine's feed (partial rollouts: with `recompute`, every
replica recomputes what it holds), then plans every replica's inputs, makes the call and
records each sample's tokens, log-probs, weight versions, top alternatives (the engine's
`top_logprobs`) and a mixture's routing, ending samples at their limits and stop strings.

Used as a context manager: leaving it after a failure (any exception, an interrupt) resets the
engine (nothing retained, every page free); leaving it normally checks that the pools hold only
the retained sequences (anything else is a bookkeeping bug); either way what the replicas did is
added to the engine's counters.

`rollout` is a training rollout through it (`PagedBackend.generate`); rl_core.rollout.serving's
`EngineLoop` admits the server's jobs into one as they arrive.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol

import jax
import numpy as np

from rl_core.rollout.backend import EngineCounters, Requests
from rl_core.rollout.pages import PagePool
from rl_core.rollout.records import PromptRecord, completions, requested_prompts
from rl_core.rollout.replica import Replica
from rl_core.rollout.retained import Retained
from rl_core.rollout.sampler import Completions, SamplingParams
from rl_core.rollout.sizing import check_fits, pages_for_one
from rl_core.rollout.step import Prefill, Slots

if TYPE_CHECKING:  # the engine's module imports this one
    from rl_core.rollout.paged_settings import EngineSettings


class LoopEngine(Protocol):
    """What the host loop reads from the engine (rl_core.rollout.paged.PagedBackend has all of it)."""

    settings: EngineSettings
    """Its shapes per replica: page size, slots, prefill chunk, k decode steps per call, most new tokens."""
    pools: list[PagePool]
    """Each replica's page pool (R of them)."""
    state_pools: list[PagePool] | None
    """Each replica's state rows (None: the model keeps no recurrent state)."""
    retained: Retained
    """The sequences it holds for a next turn (rl_core.rollout.retained)."""
    kv_window: int | None
    """Every layer's window (pages wholly behind it are given back), None when a layer sees everything."""
    fresh_share_chunks: bool
    """Prompts starting at position 0 may join a state model's prefill chunk after the first."""
    partial_rollouts: str
    """off, continue or recompute: what a running rollout does with weights published to its feed."""
    version: int
    """The weight version its next call decodes with."""
    pad_id: int
    eos_ids: tuple[int, ...]

    def rows_of(self, replica: int) -> PagePool | None:
        """`replica`'s state rows (None without a recurrent state)."""
        ...

    def ensure_pages(self) -> None:
        """Allocate the device pools unless it holds them."""
        ...

    def step_program(self, sampling: SamplingParams) -> Any:
        """The compiled device step for `sampling`."""
        ...

    def call(self, step: Any, prefill: Prefill, copy_src: np.ndarray, copy_dst: np.ndarray, slots: Slots,
             key: jax.Array) -> tuple[np.ndarray, np.ndarray, Slots, tuple[np.ndarray, np.ndarray], np.ndarray | None]:
        """One device call on every replica's inputs: tokens, log-probs, slots after, top, routing."""
        ...

    def follow_feed(self) -> bool:
        """Take weights published since the last call (True when it did)."""
        ...

    def reset_after_failure(self) -> None:
        """Nothing retained, every page free, a pool a failed call deleted dropped."""
        ...

    def count(self, tally: EngineCounters) -> None:
        """Add what a loop's replicas did to its counters."""
        ...


def _stack(trees: list[Any]) -> Any:
    return jax.tree.map(lambda *xs: np.stack(xs), *trees)


class HostLoop:
    """Device calls of `engine` with one sampling setting over the prompts admitted between them
    (see the module docstring)."""

    def __init__(self, engine: LoopEngine, sampling: SamplingParams, key: jax.Array, *,
                 decode: Callable[[list[int]], str] | None = None) -> None:
        """`key`: every sample draws with fold_in(fold_in(key, prompt id), sample index); `decode`
        (token ids to text) checks the prompts' stop strings."""
        self.engine, self.key = engine, key
        engine.ensure_pages()
        self.replicas = [Replica(engine, i, decode) for i in range(len(engine.pools))]
        self.program = engine.step_program(sampling)
        self.calls = 0  # device calls made

    def __enter__(self) -> HostLoop:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        try:
            if kind is None:
                self._check_released()
        except BaseException:
            self.engine.reset_after_failure()
            raise
        finally:
            if kind is not None:
                self.engine.reset_after_failure()
            self.engine.count(sum((x.tally() for x in self.replicas), EngineCounters()))

    @property
    def busy(self) -> bool:
        """Whether an admitted sample has not finished."""
        return any(x.remaining for x in self.replicas)

    def admit(self, prompts: Sequence[PromptRecord], replicas: Sequence[int] | None = None) -> None:
        """Let `prompts` join from the next call on: prompt i on the replica holding the sequence it
        continues, else on replica `replicas[i]` (None: the least busy one, fewest unfinished
        samples). A ValueError, before any is taken, when a completion of one could never fit a
        pool or a continued prompt has more than one sample."""
        engine, s = self.engine, self.engine.settings
        if prompts:  # the prompt needing most pages (not always the longest: a partly filled prefix page is held twice)
            worst = max((len(p.tokens) for p in prompts), key=lambda n: pages_for_one(s.page_size, n, s.max_new_tokens))
            # a resumed completion's own prompt may hold one more partly filled page, copied
            check_fits(engine.pools[0].num_pages - 1, s.page_size, worst, s.max_new_tokens,
                       spare=int(engine.partial_rollouts == "recompute"))
        handles = [p.samples[0].session for p in prompts]
        held = [engine.retained.replica_of(h) if h >= 0 else None for h in handles]
        for prompt, handle, where in zip(prompts, handles, held, strict=True):
            if where is not None and len(prompt.samples) > 1:
                raise ValueError(f"prompt {prompt.samples[0].ids[0]} continues the sequence held under handle "
                                 f"{handle} with {len(prompt.samples)} samples; a continued prompt has one "
                                 f"(num_samples=1)")
        for i, (prompt, handle, where) in enumerate(zip(prompts, handles, held, strict=True)):
            if where is not None:
                prompt.pages, prompt.reused, prompt.state = engine.retained.take(
                    handle, where, prompt.tokens, prompt.prefix, engine.pools[where], s.page_size,
                    engine.rows_of(where))
                prompt.scheduled = prompt.reused
            elif replicas is not None:
                where = replicas[i]
            else:
                where = min(range(len(self.replicas)), key=lambda j: self.replicas[j].remaining)
            self.replicas[where].admit(prompt)

    def step(self) -> None:
        """One device call advancing every replica (weights published to the engine's feed first)."""
        engine = self.engine
        if engine.follow_feed() and engine.partial_rollouts == "recompute":  # newer weights from here on
            for replica in self.replicas:
                replica.recompute()
        prefill, src, dst, slots = _stack([x.plan() for x in self.replicas])
        tokens, logp, after, top, routing = engine.call(self.program, prefill, src, dst, slots, self.key)
        self.calls += 1
        for i, replica in enumerate(self.replicas):
            replica.absorb(tokens[i], logp[i], jax.tree.map(lambda a: a[i], after), engine.version,  # noqa: B023
                           (top[0][i], top[1][i]), None if routing is None else routing[i])

    def _check_released(self) -> None:
        """A RuntimeError unless the pools hold only the retained sequences (with nothing busy)."""
        engine = self.engine
        if self.busy:
            raise RuntimeError("the host loop was left with samples unfinished")
        leaked = [pool.in_use - engine.retained.pages_on(i) for i, pool in enumerate(engine.pools)]
        if any(leaked):
            raise RuntimeError(f"scheduler bug: pages still held after the rollout ({leaked} per replica)")
        rows = [pool.in_use - engine.retained.rows_on(i) for i, pool in enumerate(engine.state_pools or [])]
        if any(rows):
            raise RuntimeError(f"scheduler bug: state rows still held after the rollout ({rows} per replica)")


def rollout(engine: LoopEngine, requests: Requests, sampling: SamplingParams, key: jax.Array) -> Completions:
    """Completions of every request (rows in request order): prompt i dealt to replica i mod R.
    Afterwards the pools hold only the retained sequences (`Requests.sessions`); however else the
    rollout ends (an exception, an interrupt), every page is free and nothing is retained."""
    prompts = requested_prompts(engine.settings, requests)
    r = len(engine.pools)
    with HostLoop(engine, sampling, key, decode=requests.decode) as loop:
        loop.admit(prompts, [i % r for i in range(len(prompts))])
        while loop.busy:
            loop.step()
    return completions([x for p in prompts for x in p.samples], engine.settings.max_new_tokens,
                       pad_id=engine.pad_id, eos_ids=engine.eos_ids, version=engine.version)


__all__ = ["HostLoop", "LoopEngine", "check_fits", "pages_for_one", "rollout"]
