"""The paged engine's host loop: pages, prefill chunks and decode slots between calls.

See rl_core.rollout.paged for the whole picture. Before each device call the
loop (1) gives every running sample the pages its next k tokens need, oldest
first, preempting the youngest when the pool is dry; (2) fills the prefill
chunk with prompt prefixes, at most S samples ahead of the free slots; (3)
starts waiting samples in free slots. After it, it records the tokens and
retires finished samples, freeing their pages.
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
from rl_core.sampler import Completions, SamplingParams


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


class _Run:
    def __init__(self, engine: Any, requests: Requests, key: jax.Array, sampling: SamplingParams) -> None:
        s = engine.settings
        self.engine, self.pool, self.sampling, self.key = engine, engine.pool, sampling, key
        self.ps, self.slots, self.m, self.k, self.t = s.page_size, s.slots, s.pages_per_sequence, s.steps_per_sync, s.max_new_tokens
        self.chunk = s.prefill_chunk
        g = requests.num_samples
        tokens, mask = np.asarray(requests.prompt_tokens), np.asarray(requests.prompt_mask) > 0
        ids = requests.ids()
        self.prompts: list[_Prompt] = []
        self.samples: list[_Sample] = []
        for i in range(len(tokens)):
            prompt = _Prompt(tokens[i][mask[i]].astype(np.int32), unfinished=g)
            if not len(prompt.tokens):
                raise ValueError(f"prompt {i} has no token")
            if self._pages_to(prompt.prefix + self.t - 1) > self.m:
                raise ValueError(f"prompt {i} has {len(prompt.tokens)} tokens: longer than the engine's "
                                 f"max_prompt_tokens ({s.max_prompt_tokens}) allows")
            prompt.samples = [_Sample(i * g + j, prompt, (int(ids[i]), j)) for j in range(g)]
            self.prompts.append(prompt)
            self.samples.extend(prompt.samples)
        longest = max(p.prefix for p in self.prompts)
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

    # -- the loop ----------------------------------------------------------------------------

    def run(self) -> Completions:
        engine = self.engine
        step = engine._step_fn(self.sampling)
        remaining = len(self.samples)
        while remaining:
            self._grow_running()
            prefill, prefilling = self._plan_prefill()
            src, dst = self._start_waiting()
            engine.peak_pages = max(engine.peak_pages, self.pool.in_use)
            if not self.host["active"].any() and not prefilling:
                raise PoolExhausted(
                    f"the KV pool ({self.pool.num_pages - 1} pages of {self.ps} tokens, {self.pool.free} free) "
                    "cannot start any waiting sample; raise rollout.kv_pages (0 sizes it for the batch)"
                )
            before = self.host["count"].copy()
            slots = Slots(**self.host)
            engine.pages, tokens, logp, after = step(engine.weights, engine.pages, prefill, src, dst, slots, self.key)
            tokens, logp, after = jax.device_get((tokens, logp, after))
            self.calls += 1
            for name in ("token", "position", "count", "active"):
                self.host[name] = np.array(getattr(after, name))
            for slot, sample in enumerate(self.running):
                if sample is None:
                    continue
                n = int(self.host["count"][slot] - before[slot])
                sample.tokens.extend(tokens[slot, :n].tolist())
                sample.logp.extend(logp[slot, :n].tolist())
                if not self.host["active"][slot]:
                    self._finish(slot)
                    remaining -= 1
        return self._completions()

    def _completions(self) -> Completions:
        b = len(self.samples)
        tokens = np.full((b, self.t), self.engine.pad_id, np.int32)
        logp = np.zeros((b, self.t), np.float32)
        lengths = np.zeros(b, np.int32)
        for sample in self.samples:
            n = len(sample.tokens)
            tokens[sample.row, :n], logp[sample.row, :n], lengths[sample.row] = sample.tokens, sample.logp, n
        mask = (np.arange(self.t)[None, :] < lengths[:, None]).astype(np.float32)
        ended = np.isin(tokens[np.arange(b), np.maximum(lengths - 1, 0)], self.engine.eos_ids)
        return Completions(tokens, logp, mask, lengths, ~ended)


def run(engine: Any, requests: Requests, key: jax.Array, sampling: SamplingParams) -> Completions:
    """Completions of every request (rows in request order); the pool is empty afterwards."""
    return _Run(engine, requests, key, sampling).run()
