"""One data replica of the paged engine: its pages, prefill chunk and decode slots between calls.

See rl_core.rollout.paged for the whole picture and rl_core.rollout.scheduler for the loop
that deals prompts to the engine's R data replicas, each with its own page pool and S slots
(one device call advances them all). Before each call, each replica (1) gives every running
sample the pages its next k tokens need, oldest first; when its pool is dry it frees, youngest
first, the prefixes of prompts with no running sample, then running samples younger than the
one growing (both are recomputed later), but first the idle retained sequences
(rl_core.rollout.retained) and the reused pages of waiting prompts (prefilled whole later);
(2) when nothing runs, frees other prompts' prefixes until the first waiting sample can start;
(3) fills its prefill chunk with prompt prefixes, at most S samples ahead of the free slots,
leaving free what the running samples may still need and what the first waiting sample needs
to start; (4) starts waiting samples in free slots. After the call it records the tokens and
retires finished samples, freeing their pages, or keeping them as a retained sequence when
their row has a session handle. A prompt continuing a retained sequence starts with its pages
and prefills only past the part of it that it shares.

A model with a recurrent state (Qwen3.5's linear-attention layers, or the window-sized key/value
rings of a mixed windowed/global model's windowed layers: Gemma 3's) also takes state rows from
its replica's state pool (`PagedBackend.state_pools`): a prompt holds one from its prefill's
start (the state after its prefix; each prefill chunk then holds one prompt's tokens, or, where
the adapter allows it (rings), after the first more prompts that start at position 0), each
running sample one (its prompt's, copied when it starts), each retained sequence its sample's.
Rows are freed with the pages of whoever holds them, so preemption and eviction give them back
the same way; a new prefix leaves a row free for the first waiting sample, and with nothing
running, rows are taken back like pages until it starts.

Why it always finishes: nothing ever takes pages from the oldest running
sample, and once everything else is freed its prompt and its completion fit
(checked when it is admitted: one completion must fit the pool), so every
call with a running sample advances the oldest one by k tokens; a call with
none prefills or starts one. Waiting work never preempts running work.

Every process of a multi-process run runs every replica's bookkeeping (the
same deterministic work on the same gathered tokens), so all keep in step.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from rl_core.rollout.backend import EngineCounters, stop_index
from rl_core.rollout.records import PromptRecord, SampleRecord
from rl_core.rollout.step import Prefill, Slots

if TYPE_CHECKING:  # the loop's module imports this one
    from rl_core.rollout.scheduler import LoopEngine


class Replica:
    """One data replica: its page pool, its share of the prompts and its S decode slots."""

    def __init__(self, engine: LoopEngine, index: int, decode: Callable[[list[int]], str] | None = None) -> None:
        s = engine.settings
        self.engine, self.index, self.pool, self.decode = engine, index, engine.pools[index], decode
        self.rows = engine.rows_of(index)  # its state rows (None: the model keeps no recurrent state)
        self.ps, self.slots, self.m, self.k, self.t = s.page_size, s.slots, s.pages_per_sequence, s.steps_per_sync, s.max_new_tokens
        self.chunk = s.prefill_chunk
        self.remaining = 0  # its samples not finished
        self.to_prefill: collections.deque[PromptRecord] = collections.deque()
        self.prefilling: PromptRecord | None = None
        self.prefilled: list[PromptRecord] = []  # prompts holding their whole prefix, oldest first
        self.ready: collections.deque[SampleRecord] = collections.deque()
        self.running: list[SampleRecord | None] = [None] * self.slots
        self.calls = 0
        self.starts = 0
        # what this replica did, added to the engine's counters when the loop ends (`tally`)
        self.prefill_tokens = self.reused_tokens = self.preemptions = self.evictions = self.peak_pages = 0
        self.before = np.zeros(self.slots, np.int32)
        self.host = {
            "token": np.zeros(self.slots, np.int32), "position": np.zeros(self.slots, np.int32),
            "count": np.zeros(self.slots, np.int32), "limit": np.full(self.slots, self.t, np.int32),
            "active": np.zeros(self.slots, bool), "page_rows": np.zeros((self.slots, self.m), np.int32),
            "ids": np.zeros((self.slots, 2), np.int32),
            "state_row": np.zeros(self.slots, np.int32), "state_from": np.zeros(self.slots, np.int32),
        }

    def tally(self) -> EngineCounters:
        return EngineCounters(self.prefill_tokens, self.reused_tokens, self.preemptions, self.evictions,
                              self.peak_pages)

    def admit(self, prompt: PromptRecord) -> None:
        """A prompt joining this replica (checked to fit its pool alone by the loop); one continuing
        a retained sequence comes with its pages taken (`Retained.take`)."""
        self.remaining += len(prompt.samples)
        self.to_prefill.append(prompt)

    def _pages_to(self, position: int) -> int:
        """Pages a sequence needs to hold positions 0..position."""
        return position // self.ps + 1

    def _rows_short(self, need: int) -> bool:
        """Whether fewer than `need` state rows are free (never without a recurrent state)."""
        return self.rows is not None and self.rows.free < need

    def _free_row(self, holder: PromptRecord | SampleRecord) -> None:
        if self.rows is not None and holder.state:
            self.rows.release([holder.state])
        holder.state = 0

    def _held(self, sample: SampleRecord) -> list[int]:
        """The pages `sample` still holds: its page row but the entries it dropped (`_drop_behind`)."""
        return (self._shared(sample) + sample.own)[sample.dropped:]

    def _drop_behind(self, sample: SampleRecord, position: int) -> None:
        """When every layer is windowed (`engine.kv_window` W), give back the pages wholly behind
        the window of the query at `position` (no later query reads them; the reference attention
        reads only blocks holding a window's slots, and their page-row entries point at scratch);
        a sample with a session keeps its whole sequence for the next turn."""
        w = self.engine.kv_window
        if w is None or sample.session >= 0:
            return
        behind = max(0, (position - w + 1) // self.ps)
        if behind > sample.dropped:
            self.pool.release((self._shared(sample) + sample.own)[sample.dropped:behind])
            sample.dropped = behind

    def _row(self, pages: list[int]) -> np.ndarray:
        return np.pad(np.asarray(pages, np.int32), (0, self.m - len(pages)))

    def _shared(self, sample: SampleRecord) -> list[int]:
        return sample.prompt.pages[: sample.prompt.prefix // self.ps]  # full prefix pages only

    def _own_pages(self, sample: SampleRecord, upto: int) -> int:
        """Own pages `sample` needs to hold positions up to `upto` (at most its last one)."""
        last = sample.prompt.prefix + sample.prompt.limit - 1
        return self._pages_to(min(upto, last)) - len(self._shared(sample))

    def _start_need(self, sample: SampleRecord) -> int:
        return self._own_pages(sample, sample.prompt.prefix + self.k - 1)

    def _still_needed(self) -> int:
        """Pages the running samples may still take (each to its full length)."""
        return sum(self._own_pages(x, self.t + x.prompt.prefix) - len(x.own) for x in self._running())

    def _running(self) -> list[SampleRecord]:
        """The running samples, oldest first."""
        return sorted((x for x in self.running if x is not None), key=lambda x: x.started)

    def _idle_prompts(self, keep: PromptRecord | None = None) -> list[PromptRecord]:
        """Prompts holding prefix pages that no running sample reads (but `keep`), youngest first."""
        busy = {x.prompt for x in self._running()}
        held = ([self.prefilling] if self.prefilling is not None else []) + self.prefilled[::-1]
        return [p for p in held if (p.pages or p.state) and p not in busy and p is not keep]

    # -- freeing pages ---------------------------------------------------------------------

    def _preempt(self, sample: SampleRecord) -> None:
        """Free a running sample's pages and requeue it first; it restarts from its prompt (a
        resumed sample keeps the tokens its own prompt holds)."""
        slot = self.running.index(sample)
        self.pool.release(self._held(sample))
        self._free_row(sample)
        keep = sample.prompt.resumed
        sample.own, sample.dropped = [], 0
        del sample.tokens[keep:], sample.logp[keep:], sample.versions[keep:], sample.top[keep:], sample.routing[keep:]
        self.running[slot] = None
        self.host["active"][slot] = False
        self.ready.appendleft(sample)
        self.preemptions += 1

    def _unprefill(self, prompt: PromptRecord, *, preempted: bool = True) -> None:
        """Free the prefix of a prompt that no running sample reads; it is prefilled again later,
        ahead of the prompts never prefilled (freeing youngest first keeps their order)."""
        self.pool.release(prompt.pages)
        self._free_row(prompt)
        prompt.pages, prompt.scheduled, prompt.reused = [], 0, 0
        if prompt is self.prefilling:
            self.prefilling = None
        else:
            self.prefilled.remove(prompt)
            self.ready = collections.deque(x for x in self.ready if x.prompt is not prompt)
        self.to_prefill.appendleft(prompt)
        self.preemptions += preempted

    def _give_back(self, keep: PromptRecord | None = None, *, waiting: bool = True) -> bool:
        """Free pages no call reads: the oldest idle retained sequence, else (`waiting`) the reused
        prefix of the youngest waiting prompt but `keep` (prefilled whole later: the same tokens).
        False when there is none."""
        retained = self.engine.retained
        handle = retained.oldest(self.index)
        if handle is not None:
            retained.drop(handle, self.pool, self.rows)
        else:
            held = [p for p in self.to_prefill if (p.pages or p.state) and p is not keep] if waiting else []
            if not held:
                return False
            self.pool.release(held[-1].pages)
            self._free_row(held[-1])
            held[-1].pages, held[-1].scheduled, held[-1].reused = [], 0, 0
        self.evictions += 1
        return True

    # -- pages of running samples --------------------------------------------------------

    def _grow_running(self) -> None:
        """Pages for every running sample's next k tokens, oldest first. A dry pool frees waiting
        work first, then younger samples; a sample preempts itself only when nothing younger is
        left, which never happens to the oldest (its completion fits the pool alone)."""
        oldest = True
        for sample in self._running():
            if sample not in self.running:  # preempted for an older one
                continue
            slot = self.running.index(sample)
            need = self._own_pages(sample, int(self.host["position"][slot]) + self.k - 1) - len(sample.own)
            while need > self.pool.free:
                if self._give_back():
                    continue
                idle = self._idle_prompts()
                younger = [x for x in self._running() if x.started > sample.started]
                if idle:
                    self._unprefill(idle[0])
                elif younger:
                    self._preempt(younger[-1])
                elif oldest:
                    raise RuntimeError(f"scheduler bug: the oldest running sample needs {need} pages, "
                                       f"{self.pool.free} free and nothing left to free")
                else:
                    self._preempt(sample)
                    break
            if self.running[slot] is sample:
                sample.own += self.pool.allocate(max(need, 0))
                self._drop_behind(sample, int(self.host["position"][slot]))
                row = self._row(self._shared(sample) + sample.own)
                row[: sample.dropped] = 0  # scratch: never read
                self.host["page_rows"][slot] = row
            oldest = False

    def _room_to_start(self) -> None:
        """With nothing running, free other prompts' prefixes until the first waiting sample can
        start (it fits alone), so that a call always makes progress."""
        if not self.ready or self._running():
            return
        first = self.ready[0]
        while self._start_need(first) > self.pool.free or self._rows_short(1):
            if self._give_back():
                continue
            idle = self._idle_prompts(keep=first.prompt)
            if not idle:
                raise RuntimeError(f"scheduler bug: a waiting sample needs {self._start_need(first)} pages, "
                                   f"{self.pool.free} free and nothing left to free")
            self._unprefill(idle[0])

    # -- the prefill chunk -----------------------------------------------------------------

    def _plan_prefill(self) -> tuple[Prefill, int]:
        tokens, positions, rows, states = [], [], [], []
        while len(tokens) < self.chunk:
            if self.prefilling is None:
                if not self.to_prefill or len(self.ready) >= self.slots:
                    break
                prompt = self.to_prefill[0]
                # a recurrent state: one prompt's tokens per chunk, unless the adapter lets prompts that
                # start at position 0 join it (rings with nothing to read yet)
                if self.rows is not None and tokens and not (self.engine.fresh_share_chunks and not prompt.state
                                                             and prompt.scheduled == 0):
                    break
                # a new prefix never takes what running samples or the next start need (no thrashing);
                # it takes idle retained sequences' pages, and other waiting prompts' reused ones only
                # when nothing else could run
                reserve = self._still_needed() + (self._start_need(self.ready[0]) if self.ready else 0)
                # a state row for it, and one left for the first waiting sample
                new_rows = int(self.rows is not None and not prompt.state) + bool(self.ready)
                stuck = not self.ready and not self._running()
                while ((self.pool.free - (-(-prompt.prefix // self.ps) - len(prompt.pages)) < reserve
                        or self._rows_short(new_rows)) and self._give_back(keep=prompt, waiting=stuck)):
                    pass
                n = -(-prompt.prefix // self.ps) - len(prompt.pages)  # beyond the pages it reuses
                if self.pool.free - n < reserve or self._rows_short(new_rows):
                    break
                prompt.pages += self.pool.allocate(n)
                if self.rows is not None and not prompt.state:
                    prompt.state = self.rows.allocate(1)[0]
                self.to_prefill.popleft()
                self.prefilling = prompt
            prompt = self.prefilling
            take = min(self.chunk - len(tokens), prompt.prefix - prompt.scheduled)
            span = np.arange(prompt.scheduled, prompt.scheduled + take)
            tokens.extend(prompt.tokens[span])
            positions.extend(span)
            rows.extend([self._row(prompt.pages)] * take)
            states.extend([prompt.state] * take)
            prompt.scheduled += take
            self.prefill_tokens += take
            if prompt.scheduled == prompt.prefix:  # written by this call, before its decode steps
                self.reused_tokens += prompt.reused
                # all but the finished and those resumed on a prompt of their own
                self.ready.extend(x for x in prompt.samples if not x.done and x.prompt is prompt)
                self.prefilled.append(prompt)
                self.prefilling = None
        pad = self.chunk - len(tokens)
        prefill = Prefill(
            np.asarray(tokens + [0] * pad, np.int32),
            np.asarray(positions + [0] * pad, np.int32),
            np.asarray(rows + [np.zeros(self.m, np.int32)] * pad, np.int32).reshape(self.chunk, self.m),
            np.asarray(states + [0] * pad, np.int32),
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
            need = self._start_need(sample)
            # nothing runs and a fully reused prompt left no prefill for this call: room, or it has nothing to do
            while (need > self.pool.free or self._rows_short(1)) and not self._running() and self._give_back():
                pass
            if need > self.pool.free or self._rows_short(1):
                break
            self.ready.popleft()
            sample.own = self.pool.allocate(need)
            self.pool.retain(shared)
            if self.rows is not None:  # its own state row, its prompt's copied in before decoding
                sample.state = self.rows.allocate(1)[0]
                self.host["state_row"][slot], self.host["state_from"][slot] = sample.state, prompt.state
            if prompt.prefix % self.ps:  # its own copy of the partly filled prefix page
                src[slot], dst[slot] = prompt.pages[len(shared)], sample.own[0]
            sample.started, self.starts = self.starts, self.starts + 1
            self.running[slot] = sample
            h = self.host
            h["token"][slot], h["position"][slot], h["count"][slot] = prompt.tokens[-1], prompt.prefix, prompt.resumed
            h["limit"][slot] = prompt.limit + prompt.resumed  # counts the resumed tokens too (their keys)
            h["active"][slot], h["ids"][slot] = True, sample.ids
            h["page_rows"][slot] = self._row(shared + sample.own)
        return src, dst

    def _finish(self, slot: int) -> None:
        sample = self.running[slot]
        assert sample is not None
        pages = self._shared(sample) + sample.own  # its page row
        if sample.session >= 0:  # kept for a next turn: every token but the last was run
            base = sample.prompt.tokens[: len(sample.prompt.tokens) - sample.prompt.resumed]  # a resumed one's own
            tokens = np.concatenate([base, np.asarray(sample.tokens[:-1], np.int32)])
            self.engine.retained.keep(sample.session, self.index, tokens, pages, self.pool, self.ps, self.rows,
                                      sample.state)
            sample.state = 0  # the retained sequence's now
        else:
            self.pool.release(pages[sample.dropped:])
            self._free_row(sample)
        sample.own, sample.done, sample.dropped = [], True, 0
        self.running[slot] = None
        prompt = sample.prompt
        prompt.unfinished -= 1
        if prompt.unfinished == 0:
            self.pool.release(prompt.pages)
            self._free_row(prompt)
            prompt.pages = []
            self.prefilled.remove(prompt)

    # -- new weights mid-rollout (rollout.partial_rollouts = recompute) ----------------------

    def recompute(self) -> None:
        """Every key and value computed so far is recomputed under the new weights: running
        samples stop, keep their tokens (with the versions and log-probs that sampled them) and
        resume, oldest first, from a prompt of their own, their prompt followed by those tokens;
        every held prompt prefix (reused ones too) is freed and prefilled again, and the replica's
        retained sequences are dropped. Nothing is lost but the pages."""
        running = self._running()
        limits = {id(x): int(self.host["limit"][self.running.index(x)]) for x in running}  # stop strings lower them
        for sample in running:
            slot = self.running.index(sample)
            self.pool.release(self._held(sample))
            self._free_row(sample)
            sample.own, sample.dropped, self.running[slot] = [], 0, None
            self.host["active"][slot] = False
        for prompt in self._idle_prompts():  # every held prefix now, youngest first
            self._unprefill(prompt, preempted=False)
        for prompt in self.to_prefill:  # waiting prompts holding a retained sequence's pages
            self.pool.release(prompt.pages)
            self._free_row(prompt)
            prompt.pages, prompt.scheduled, prompt.reused = [], 0, 0
        retained = self.engine.retained
        while (handle := retained.oldest(self.index)) is not None:
            retained.drop(handle, self.pool, self.rows)
        for sample in reversed(running):
            self.to_prefill.appendleft(self._resumed(sample, limits[id(sample)]))

    def _resumed(self, sample: SampleRecord, limit: int) -> PromptRecord:
        """`sample` moved to a prompt of its own: its original prompt and its `len(sample.tokens)`
        tokens (`limit`: most tokens in all, its slot's)."""
        old, n = sample.prompt, len(sample.tokens)
        base = old.tokens[: len(old.tokens) - old.resumed]
        prompt = PromptRecord(np.concatenate([base, np.asarray(sample.tokens, np.int32)]), samples=[sample], unfinished=1,
                         limit=limit - n, stops=old.stops, resumed=n)
        old.unfinished -= 1
        if not old.unfinished and old in self.to_prefill:  # no sample left to read its prefix
            self.to_prefill.remove(old)
        sample.prompt = prompt
        return prompt

    # -- one call ---------------------------------------------------------------------------

    def plan(self) -> tuple[Prefill, np.ndarray, np.ndarray, Slots]:
        """This replica's inputs to the next call (pages grown, prefill chunk, new samples started)."""
        self._grow_running()
        self._room_to_start()
        prefill, prefilling = self._plan_prefill()
        self.host["state_from"][:] = 0  # copied once, when a sample starts
        src, dst = self._start_waiting()
        self.peak_pages = max(self.peak_pages, self.pool.in_use)
        if self.remaining and not self.host["active"].any() and not prefilling:  # cannot happen (see above)
            raise RuntimeError(f"scheduler bug: a call with nothing to do ({self.pool.free} of "
                               f"{self.pool.num_pages - 1} pages free, {len(self.ready)} samples waiting)")
        self.before = self.host["count"].copy()
        return prefill, src, dst, Slots(**self.host)

    def absorb(self, tokens: np.ndarray, logp: np.ndarray, after: Slots, version: int,
               top: tuple[np.ndarray, np.ndarray] | None = None, routing: np.ndarray | None = None) -> None:
        """Record the call's tokens [S, k], sampled by weight `version` (with their top alternatives
        [S, k, K] when K > 0, and a mixture of experts' routing [S, k, layers, E_k]), and retire the
        samples that ended."""
        self.calls += 1
        for name in ("token", "position", "count", "active"):
            self.host[name] = np.array(getattr(after, name))
        for slot, sample in enumerate(self.running):
            if sample is None:
                continue
            n = int(self.host["count"][slot] - self.before[slot])
            sample.tokens.extend(tokens[slot, :n].tolist())
            sample.logp.extend(logp[slot, :n].tolist())
            sample.versions.extend([version] * n)
            if routing is not None:
                sample.routing.extend(routing[slot, :n])
            if top is not None and top[0].shape[-1]:
                sample.top.extend((top[0][slot, t].tolist(), top[1][slot, t].tolist()) for t in range(n))
            if self.host["active"][slot] and n and sample.prompt.stops:
                assert self.decode is not None  # Requests.stops checked it
                end = stop_index(sample.tokens, sample.prompt.stops, self.decode)
                if end is not None and end <= len(sample.tokens):  # a stop string: it ends here
                    self.host["active"][slot] = False
                elif end is not None:  # the stop ended with its last token: one more (an EOS may follow)
                    self.host["limit"][slot] = min(int(self.host["limit"][slot]), end)
            if not self.host["active"][slot]:
                self._finish(slot)
                self.remaining -= 1


__all__ = ["Replica"]
