"""The protocol every rollout backend follows, and what flows through it.

A backend turns requests (prompts, each sampled `num_samples` times) into
completions with the weights it was last given. It owns its inference
weights: `update_weights(params, version)` hands it the learner's master
parameters once per step, and every completion it returns records the
version that produced it (what asynchronous rollouts and importance weights
key on).

Everything a caller may use is here: the protocol's methods and the `Capabilities`
the backend declares (rl_core.rollout.capabilities: what it does with per-row limits, retained
sequences, weights offered mid-rollout, the weights it was given). Callers of a built backend
outside the engines' own modules (the learner's generator and pipeline, a judge) use the protocol
and branch only on its `capabilities`, never on its type or other attributes; counters are read
through `counters()`, never written from outside. Before one is built, callers read its engine's
record (rl_core.rollout.engines.Engine): its settings class and what it `offers`; `RolloutConfig`
checks partial rollouts and agent episodes against it, and `auto` picks by the records' thresholds.

Backends are found by name through the entry-point group `rl_core.engines`
(rl_core.rollout.engines): `static` (rl_core.rollout.static: the one-program
sampler, for tests and tiny runs) and `paged` (rl_core.rollout.paged: paged KV
cache and continuous batching, for real lengths).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, Protocol, runtime_checkable

import jax
import numpy as np

from rl_core.rollout.capabilities import Capabilities
from rl_core.rollout.sampler import Completions, SamplingParams


class Requests(NamedTuple):
    """U prompts, each to be sampled `num_samples` (G) times.

    Row i * G + j of the completions is sample j of prompt i. `prompt_ids`
    name the prompts for their random keys (backends that key each completion by
    (prompt id, sample index), like `paged`, give a prompt the same completions
    whichever other requests share the call).

    Each prompt may also say where its samples end (`max_new_tokens`, `stop_strings`,
    which need `decode`). A backend with `row_limits = True` (the paged engine) stops
    each sample there; others may ignore them and decode to their own length (the
    caller cuts what it keeps either way).
    """

    prompt_tokens: np.ndarray  # [U, P] int32, left-padded
    prompt_mask: np.ndarray  # [U, P], 1 = real token
    num_samples: int = 1
    prompt_ids: np.ndarray | None = None  # [U] int; None = 0..U-1
    max_new_tokens: np.ndarray | None = None
    """[U] int >= 1: most new tokens of each prompt's samples (capped at the backend's own); None: the backend's."""
    stop_strings: Sequence[Sequence[str]] | None = None
    """[U] per prompt: a sample ends soon after its new tokens' text holds one of them (see `stop_index`)."""
    decode: Callable[[list[int]], str] | None = None
    """Token ids to text (the tokenizer's): what `stop_strings` are checked on."""
    sessions: np.ndarray | None = None
    """[U * G] int per row, on a backend that `retains` sequences (the paged engine): a row with a
    handle (>= 0) continues the sequence held under it, if any (its prompt's prefill starts where
    the prompt and the held tokens part), and leaves its own sequence held under it when it ends,
    until `release`. -1 or None: nothing held (see rl_core.rollout.retained)."""

    def ids(self) -> np.ndarray:
        u = len(self.prompt_tokens)
        ids = np.arange(u) if self.prompt_ids is None else np.asarray(self.prompt_ids)
        if ids.shape != (u,):
            raise ValueError(f"prompt_ids has shape {ids.shape}; expected ({u},), one id per prompt")
        return ids.astype(np.int64)

    def limits(self, most: int) -> np.ndarray:
        """[U] each prompt's new-token limit, capped at `most` (the backend's max_new_tokens)."""
        u = len(self.prompt_tokens)
        if self.max_new_tokens is None:
            return np.full(u, most, np.int64)
        limits = np.asarray(self.max_new_tokens).astype(np.int64)
        if limits.shape != (u,) or (limits < 1).any():
            raise ValueError(f"max_new_tokens must be one int >= 1 per prompt ({u}), got {self.max_new_tokens!r}")
        return np.minimum(limits, most)

    def stops(self) -> list[tuple[str, ...]]:
        """[U] each prompt's stop strings (empty ones dropped); a ValueError without `decode` to check them."""
        u = len(self.prompt_tokens)
        if self.stop_strings is None:
            return [()] * u
        if len(self.stop_strings) != u:
            raise ValueError(f"stop_strings has {len(self.stop_strings)} entries; expected {u}, one per prompt")
        stops = [tuple(s for s in row if s) for row in self.stop_strings]
        if any(stops) and self.decode is None:
            raise ValueError("stop_strings need decode= (token ids to text) to be checked")
        return stops

    def handles(self) -> np.ndarray:
        """[U * G] each row's session handle (-1: none), checked: one per row, none used twice."""
        rows = len(self.prompt_tokens) * self.num_samples
        if self.sessions is None:
            return np.full(rows, -1, np.int64)
        handles = np.asarray(self.sessions).astype(np.int64)
        if handles.shape != (rows,):
            raise ValueError(f"sessions has shape {handles.shape}; expected ({rows},), one handle per row")
        used = handles[handles >= 0]
        if len(np.unique(used)) != len(used):
            raise ValueError(f"sessions names a handle for two rows: {sorted(used.tolist())}")
        return handles


def stop_index(tokens: list[int], stops: Sequence[str], decode: Callable[[list[int]], str]) -> int | None:
    """Where a sample whose new tokens are `tokens` may end for a stop string: None while their
    text holds none; else the tokens it must have, `len(tokens)` when the text held one already
    before the last token, else one more (the token after the stop, which a caller keeps when it
    is an end-of-sequence). Text is checked, not token ids: a BPE tokenizer can spell a stop
    string with many token sequences, and merge its last characters with the next ones."""
    if not stops or not any(s in decode(tokens) for s in stops):
        return None
    before = decode(tokens[:-1])
    return len(tokens) if any(s in before for s in stops) else len(tokens) + 1


@dataclasses.dataclass(frozen=True)
class EngineCounters:
    """What a backend did since it was built (all zero for one that does not count)."""

    prefill_tokens: int = 0
    """Prompt tokens prefilled (again, after a preemption or an eviction)."""
    reused_tokens: int = 0
    """Prompt tokens continued from a retained sequence instead of prefilled."""
    preemptions: int = 0
    """Samples and prefixes whose pages were taken back while they ran (they restart)."""
    evictions: int = 0
    """Retained sequences and reused prefixes given back to a dry pool."""
    peak_pages: int = 0
    """Most KV pages one replica held at once."""

    def __add__(self, other: EngineCounters) -> EngineCounters:
        return EngineCounters(self.prefill_tokens + other.prefill_tokens, self.reused_tokens + other.reused_tokens,
                              self.preemptions + other.preemptions, self.evictions + other.evictions,
                              max(self.peak_pages, other.peak_pages))


class StatelessBackend:
    """The protocol's session, feed and counter members for an engine that keeps nothing between
    calls (no retained sequences, no weights switched mid-rollout, no pages): subclass it and
    write only `update_weights` and `generate` (rl_core.rollout.static, the trainer's remote engine)."""

    def publish(self, params: Any, version: int) -> bool:
        return False  # nothing runs between calls, so nothing switches mid-rollout

    def new_sessions(self, n: int) -> np.ndarray:
        return np.full(n, -1, np.int64)

    def release(self, handles: Sequence[int] | np.ndarray | None = None) -> None:
        return None

    def counters(self) -> EngineCounters:
        return EngineCounters()


@runtime_checkable
class RolloutBackend(Protocol):
    """Generates completions with the weights of the last `update_weights`."""

    version: int
    """The weight version the next completions are generated with (-1 before any update)."""

    capabilities: Capabilities
    """What it does beyond the minimum (see `Capabilities`)."""

    def update_weights(self, params: Any, version: int) -> None:
        """Take the policy's parameters (the whole tree `nnx.merge` takes; master weights
        in their training layout) as weight version `version`; called once per step."""
        ...

    def generate(self, requests: Requests, sampling: SamplingParams, key: jax.Array) -> Completions:
        """Completions [U * G, T] with `version` (one entry per row) and `token_version` filled in."""
        ...

    def publish(self, params: Any, version: int) -> bool:
        """Offer `params` as weight `version` to the rollout running now (from another thread);
        False (and nothing kept) unless `capabilities.takes_published`."""
        ...

    def new_sessions(self, n: int) -> np.ndarray:
        """`n` handles for `Requests.sessions` it never gave out (-1 each unless `capabilities.retains`)."""
        ...

    def release(self, handles: Sequence[int] | np.ndarray | None = None) -> None:
        """Free the sequences held under `handles` (None: all); nothing to do unless it `retains`."""
        ...

    def counters(self) -> EngineCounters:
        """What it did so far (a snapshot; see `EngineCounters`)."""
        ...


def with_version(out: Completions, version: int) -> Completions:
    """`out` with every row and token stamped with weight `version`."""
    return out._replace(version=np.full(out.lengths.shape[0], version, np.int32),
                        token_version=np.full(np.shape(out.tokens), version, np.int32))
