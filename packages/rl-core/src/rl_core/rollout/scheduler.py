"""The paged engine's host loop: pages, prefill chunks and decode slots between calls.

See rl_core.rollout.paged for the whole picture. The prompts are dealt to the
engine's R data replicas (prompt i to replica i mod R), each with its own page
pool and S slots; one device call advances every replica. Before each call,
each replica (1) gives every running sample the pages its next k tokens need,
oldest first, preempting the youngest when its pool is dry; (2) fills its
prefill chunk with prompt prefixes, at most S samples ahead of the free slots;
(3) starts waiting samples in free slots. After the call it records the tokens
and retires finished samples, freeing their pages.

Every process of a multi-process run runs every replica's bookkeeping (the
same deterministic work on the same gathered tokens), so all keep in step.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any

import jax
import numpy as np

from rl_core.rollout.backend import Requests
from rl_core.rollout.pages import PoolExhausted
from rl_core.rollout.step import Prefill, Slots
from rl_core.rollout.sampler import Completions, SamplingParams


@dataclasses.dataclass(eq=False)
class _Prompt:
    tokens: np.ndarray  # its real tokens
    samples: list[_Sample] = dataclasses.field(default_factory=list)
    pages: list[int] = dataclasses.field(default_factory=list)  # the prefix's pages (all but the last token)
    scheduled: int = 0  # prefix tokens sent to prefill
    unfinished: int = 0

    @property
    def prefix(self) -> int:
        return len(self.tokens) - 1


@dataclasses.dataclass(eq=False)
class _Sample:
    row: int
    prompt: _Prompt
    ids: tuple[int, int]  # (prompt id, sample index): its key
    own: list[int] = dataclasses.field(default_factory=list)  # its pages (first: its copy of a partial prefix page)
    tokens: list[int] = dataclasses.field(default_factory=list)
    logp: list[float] = dataclasses.field(default_factory=list)
    started: int = -1


def _prompts(settings: Any, requests: Requests) -> list[_Prompt]:
    """The requests as prompts with their samples (rows in request order), checked against the engine."""
    g, ps, m, t = requests.num_samples, settings.page_size, settings.pages_per_sequence, settings.max_new_tokens
    tokens, mask = np.asarray(requests.prompt_tokens), np.asarray(requests.prompt_mask) > 0
    ids = requests.ids()
    prompts = []
    for i in range(len(tokens)):
        prompt = _Prompt(tokens[i][mask[i]].astype(np.int32), unfinished=g)
        if not len(prompt.tokens):
            raise ValueError(f"prompt {i} has no token")
        if (prompt.prefix + t - 1) // ps + 1 > m:
            raise ValueError(f"prompt {i} has {len(prompt.tokens)} tokens: longer than the engine's "
                             f"max_prompt_tokens ({settings.max_prompt_tokens}) allows")
        prompt.samples = [_Sample(i * g + j, prompt, (int(ids[i]), j)) for j in range(g)]
        prompts.append(prompt)
    return prompts


class _Replica:
    """One data replica: its page pool, its share of the prompts and its S decode slots."""

    def __init__(self, engine: Any, pool: Any, prompts: list[_Prompt]) -> None:
        s = engine.settings
        self.engine, self.pool = engine, pool
        self.ps, self.slots, self.m, self.k, self.t = s.page_size, s.slots, s.pages_per_sequence, s.steps_per_sync, s.max_new_tokens
        self.chunk = s.prefill_chunk
        self.prompts = prompts
        self.samples = [x for p in prompts for x in p.samples]
        self.remaining = len(self.samples)
        longest = max((p.prefix for p in self.prompts), default=0)
        one = -(-longest // self.ps) + self._pages_to(longest + self.t - 1) - longest // self.ps
        if one > self.pool.num_pages - 1:
            raise PoolExhausted(
                f"the KV pool has {self.pool.num_pages - 1} pages of {self.ps} tokens; one completion of "
                f"{self.t} tokens after a {longest + 1}-token prompt needs {one}. Raise rollout.kv_pages "
                "(0 sizes the pool for the batch) or lower max_new_tokens"
            )
        self.to_prefill = collections.deque(self.prompts)
        self.prefilling: _Prompt | None = None
        self.ready: collections.deque[_Sample] = collections.deque()
        self.running: list[_Sample | None] = [None] * self.slots
        self.calls = 0
        self.before = np.zeros(self.slots, np.int32)
        self.host = {
            "token": np.zeros(self.slots, np.int32), "position": np.zeros(self.slots, np.int32),
            "count": np.zeros(self.slots, np.int32), "limit": np.full(self.slots, self.t, np.int32),
            "active": np.zeros(self.slots, bool), "page_rows": np.zeros((self.slots, self.m), np.int32),
            "ids": np.zeros((self.slots, 2), np.int32),
        }

    def _pages_to(self, position: int) -> int:
        """Pages a sequence needs to hold positions 0..position."""
        return position // self.ps + 1

    def _row(self, pages: list[int]) -> np.ndarray:
        return np.pad(np.asarray(pages, np.int32), (0, self.m - len(pages)))

    def _shared(self, sample: _Sample) -> list[int]:
        return sample.prompt.pages[: sample.prompt.prefix // self.ps]  # full prefix pages only

    # -- pages of running samples --------------------------------------------------------

    def _grow_running(self) -> None:
        order = sorted((x for x in self.running if x is not None), key=lambda x: x.started)
        for sample in order:
            if sample not in self.running:  # preempted for an older one
                continue
            slot = self.running.index(sample)
            prompt = sample.prompt
            upto = min(int(self.host["position"][slot]) + self.k - 1, prompt.prefix + self.t - 1)
            need = self._pages_to(upto) - len(self._shared(sample)) - len(sample.own)
            while need > 0 and self.running[slot] is sample:
                try:
                    sample.own += self.pool.allocate(need)
                    need = 0
                except PoolExhausted:
                    self._preempt(max((x for x in self.running if x is not None), key=lambda x: x.started))
            if self.running[slot] is sample:
                self.host["page_rows"][slot] = self._row(self._shared(sample) + sample.own)

    def _preempt(self, sample: _Sample) -> None:
        """Free a running sample's pages and requeue it first; it restarts from its prompt."""
        slot = self.running.index(sample)
        self.pool.release(sample.own + self._shared(sample))
        sample.own, sample.tokens, sample.logp = [], [], []
        self.running[slot] = None
        self.host["active"][slot] = False
        self.ready.appendleft(sample)
        self.engine.preemptions += 1

    # -- the prefill chunk -----------------------------------------------------------------

    def _plan_prefill(self) -> tuple[Prefill, int]:
        tokens, positions, rows = [], [], []
        reserve = sum(x is not None for x in self.running)  # a page per running sample this call
        while len(tokens) < self.chunk:
            if self.prefilling is None:
                if not self.to_prefill or len(self.ready) >= self.slots:
                    break
                prompt = self.to_prefill[0]
                n = -(-prompt.prefix // self.ps)
                if self.pool.free - n < reserve:
                    break
                prompt.pages = self.pool.allocate(n)
                self.to_prefill.popleft()
                self.prefilling = prompt
            prompt = self.prefilling
            take = min(self.chunk - len(tokens), prompt.prefix - prompt.scheduled)
            span = np.arange(prompt.scheduled, prompt.scheduled + take)
            tokens.extend(prompt.tokens[span])
            positions.extend(span)
            rows.extend([self._row(prompt.pages)] * take)
            prompt.scheduled += take
            if prompt.scheduled == prompt.prefix:  # written by this call, before its decode steps
                self.ready.extend(prompt.samples)
                self.prefilling = None
        pad = self.chunk - len(tokens)
        prefill = Prefill(
            np.asarray(tokens + [0] * pad, np.int32),
            np.asarray(positions + [0] * pad, np.int32),
            np.asarray(rows + [np.zeros(self.m, np.int32)] * pad, np.int32).reshape(self.chunk, self.m),
        )
        return prefill, len(tokens)

    # -- starting samples ------------------------------------------------------------------

    def _start_waiting(self) -> tuple[np.ndarray, np.ndarray]:
        src, dst = np.zeros(self.slots, np.int32), np.zeros(self.slots, np.int32)
        for slot in range(self.slots):
            if self.running[slot] is not None or not self.ready:
                continue
            sample = self.ready[0]
            prompt = sample.prompt
            shared = self._shared(sample)
            need = self._pages_to(min(prompt.prefix + self.k - 1, prompt.prefix + self.t - 1)) - len(shared)
            if need > self.pool.free:
                break
            self.ready.popleft()
            sample.own = self.pool.allocate(need)
            self.pool.retain(shared)
            if prompt.prefix % self.ps:  # its own copy of the partly filled prefix page
                src[slot], dst[slot] = prompt.pages[len(shared)], sample.own[0]
            sample.started = self.calls
            self.running[slot] = sample
            h = self.host
            h["token"][slot], h["position"][slot], h["count"][slot] = prompt.tokens[-1], prompt.prefix, 0
            h["active"][slot], h["ids"][slot] = True, sample.ids
            h["page_rows"][slot] = self._row(shared + sample.own)
        return src, dst

    def _finish(self, slot: int) -> None:
        sample = self.running[slot]
        assert sample is not None
        self.pool.release(sample.own + self._shared(sample))
        sample.own = []
        self.running[slot] = None
        prompt = sample.prompt
        prompt.unfinished -= 1
        if prompt.unfinished == 0:
            self.pool.release(prompt.pages)

    # -- one call ---------------------------------------------------------------------------

    def plan(self) -> tuple[Prefill, np.ndarray, np.ndarray, Slots]:
        """This replica's inputs to the next call (pages grown, prefill chunk, new samples started)."""
        self._grow_running()
        prefill, prefilling = self._plan_prefill()
        src, dst = self._start_waiting()
        self.engine.peak_pages = max(self.engine.peak_pages, self.pool.in_use)
        if self.remaining and not self.host["active"].any() and not prefilling:
            raise PoolExhausted(
                f"the KV pool ({self.pool.num_pages - 1} pages of {self.ps} tokens, {self.pool.free} free) "
                "cannot start any waiting sample; raise rollout.kv_pages (0 sizes it for the batch)"
            )
        self.before = self.host["count"].copy()
        return prefill, src, dst, Slots(**self.host)

    def absorb(self, tokens: np.ndarray, logp: np.ndarray, after: Slots) -> None:
        """Record the call's tokens [S, k] and retire the samples that ended."""
        self.calls += 1
        for name in ("token", "position", "count", "active"):
            self.host[name] = np.array(getattr(after, name))
        for slot, sample in enumerate(self.running):
            if sample is None:
                continue
            n = int(self.host["count"][slot] - self.before[slot])
            sample.tokens.extend(tokens[slot, :n].tolist())
            sample.logp.extend(logp[slot, :n].tolist())
            if not self.host["active"][slot]:
                self._finish(slot)
                self.remaining -= 1


def _completions(engine: Any, samples: list[_Sample], t: int) -> Completions:
    b = len(samples)
    tokens = np.full((b, t), engine.pad_id, np.int32)
    logp = np.zeros((b, t), np.float32)
    lengths = np.zeros(b, np.int32)
    for sample in samples:
        n = len(sample.tokens)
        tokens[sample.row, :n], logp[sample.row, :n], lengths[sample.row] = sample.tokens, sample.logp, n
    mask = (np.arange(t)[None, :] < lengths[:, None]).astype(np.float32)
    ended = np.isin(tokens[np.arange(b), np.maximum(lengths - 1, 0)], engine.eos_ids)
    return Completions(tokens, logp, mask, lengths, ~ended)


def _stack(trees: list[Any]) -> Any:
    return jax.tree.map(lambda *xs: np.stack(xs), *trees)


def run(engine: Any, requests: Requests, key: jax.Array, sampling: SamplingParams) -> Completions:
    """Completions of every request (rows in request order); every pool is empty afterwards."""
    prompts = _prompts(engine.settings, requests)
    r = len(engine.pools)
    replicas = [_Replica(engine, pool, prompts[i::r]) for i, pool in enumerate(engine.pools)]
    step = engine._step_fn(sampling)
    while any(x.remaining for x in replicas):
        prefill, src, dst, slots = _stack([x.plan() for x in replicas])
        tokens, logp, after = engine.call(step, prefill, src, dst, slots, key)
        for i, replica in enumerate(replicas):
            replica.absorb(tokens[i], logp[i], jax.tree.map(lambda a: a[i], after))  # noqa: B023
    return _completions(engine, [x for p in prompts for x in p.samples], engine.settings.max_new_tokens)
