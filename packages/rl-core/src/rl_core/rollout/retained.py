"""The paged engine's retained sequences: finished sequences whose pages it keeps for a next turn.

A request row with a session handle (`Requests.sessions`) leaves its sequence in the pool
when it ends, held under that handle: its pages and the tokens whose keys and values they
hold (the prompt and every new token but the last, which was sampled, never run). A later
request whose prompt continues the sequence (an episode's history: the prompt, the turns as
the episode kept them, the observations) names the same handle; the engine then starts its
prefill at the longest common prefix of the held tokens and the new prompt. The held tokens
past it (a turn's tokens the episode cut, at a stop string) are dropped, and so are the
pages wholly past it. So a caller sends the whole history, as without a handle: whatever the
engine still holds is a saving, whatever it gave back (an eviction) is prefilled again, and
the tokens and log-probs are the same either way.

A model with a recurrent state (Qwen3.5's linear-attention layers) holds its sequence's state row
too (`Held.state`, in the replica's state pool): the state after the held tokens, which cannot be
rewound, so a prompt continues from it only when it continues the whole held sequence; a
prompt that shares less is prefilled whole (the held pages and row freed).

A held sequence is idle (no call reads it) until a request continues it; idle ones are the
first the scheduler frees when its pool runs short, oldest first. `release(handles)` frees
them when their episodes end; new weights (their keys and values are stale) and any
exception mid-rollout free them all.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from rl_core.rollout.pages import PagePool


@dataclasses.dataclass(eq=False)
class Held:
    replica: int  # whose pool holds its pages
    tokens: np.ndarray  # the tokens whose keys and values its pages hold, positions 0..len-1
    pages: list[int]  # its page row: page j holds positions j * ps .. (j + 1) * ps - 1
    state: int = 0  # its state row after the held tokens (a model with a recurrent state; 0: none)


class Retained:
    """The held sequences of one engine, by handle (oldest first), over its replicas' pools."""

    def __init__(self) -> None:
        self.held: dict[int, Held] = {}
        self._next = 0

    def new_handles(self, n: int) -> np.ndarray:
        """`n` handles never given out before by this engine."""
        out = np.arange(self._next, self._next + n, dtype=np.int64)
        self._next += n
        return out

    def keep(self, handle: int, replica: int, tokens: np.ndarray, pages: list[int], pool: PagePool,
             page_size: int, rows: PagePool | None = None, state: int = 0) -> None:
        """Hold `pages` (the caller's references pass to the store) for `tokens`, and state row
        `state` of `rows` (the caller's too); pages past them are freed."""
        needed = -(-len(tokens) // page_size)
        pool.release(pages[needed:])
        self.drop(handle, pool, rows)  # a handle names one sequence: the older one goes
        self.held[handle] = Held(replica, np.asarray(tokens, np.int32), pages[:needed], state)

    def take(self, handle: int, replica: int, prompt: np.ndarray, prefix: int, pool: PagePool,
             page_size: int, rows: PagePool | None = None) -> tuple[list[int], int, int]:
        """(pages, reused, state row) for a prompt continuing `handle` on `replica`: the pages holding
        its first `reused` positions (the common prefix with the held tokens, at most `prefix`), now
        the caller's, and with `rows` (a recurrent state) its state row, only when `reused` is the
        whole held sequence (else nothing is reused); the rest of the held sequence is freed.
        ([], 0, 0) when nothing is held there."""
        held = self.held.get(handle)
        if held is None or held.replica != replica:
            return [], 0, 0
        del self.held[handle]
        n = min(len(held.tokens), prefix)
        differ = np.flatnonzero(held.tokens[:n] != prompt[:n])
        reused = int(differ[0]) if len(differ) else n
        keep = -(-reused // page_size)
        if reused % page_size and pool.refcount(held.pages[keep - 1]) > 1:
            # the prefill writes into the page holding position `reused`: never into a shared one
            reused -= reused % page_size
            keep -= 1
        state = held.state
        if rows is not None and reused != len(held.tokens):  # the state is the whole sequence's: none to reuse
            reused = keep = state = 0
            rows.release([held.state])
        pool.release(held.pages[keep:])
        return held.pages[:keep], reused, state

    def replica_of(self, handle: int) -> int | None:
        held = self.held.get(handle)
        return None if held is None else held.replica

    def drop(self, handle: int, pool: PagePool, rows: PagePool | None = None) -> bool:
        """Free `handle`'s pages and its state row of `rows` (False: nothing was held)."""
        held = self.held.pop(handle, None)
        if held is None:
            return False
        pool.release(held.pages)
        if rows is not None and held.state:
            rows.release([held.state])
        return True

    def oldest(self, replica: int) -> int | None:
        """The oldest handle held on `replica`, or None."""
        return next((h for h, x in self.held.items() if x.replica == replica), None)

    def pages_on(self, replica: int) -> int:
        """Distinct pages held on `replica` (sequences of one prompt share its full prefix pages)."""
        return len({p for x in self.held.values() if x.replica == replica for p in x.pages})

    def rows_on(self, replica: int) -> int:
        """State rows held on `replica` (one per held sequence of a model with a recurrent state)."""
        return sum(1 for x in self.held.values() if x.replica == replica and x.state)

    def forget(self) -> None:
        """Hold nothing (the pools are reset by the caller)."""
        self.held.clear()
