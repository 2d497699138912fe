"""The optional abilities of a policy (`Policy`) and of its paged adapter (`PagedModel`), one
small protocol each (rl_core.policy.protocols says what every one must have).

A model has an ability when it has the method: callers ask `isinstance(policy, RoutedPolicy)`,
never `getattr(policy, "routed", None)`, so each optional method is named and documented once,
here. rl_models' transformers and their adapter (rl_models.PAGED_TRANSFORMER) have them all.

Shapes: B batch, L query tokens, D hidden, V vocab; N tokens of a paged call, M pages per sequence.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

import jax

# -- a policy's ------------------------------------------------------------------------------------


@runtime_checkable
class RoutedPolicy(Protocol):
    """A mixture of experts that reports its routing (rl_core.policy.protocols.routed_call)."""

    def routed(self, tokens: jax.Array, positions: jax.Array, attention_mask: jax.Array, cache: Any = None,
               cache_index: jax.Array | int = 0, *, outputs_from: int = 0, replay: jax.Array | None = None
               ) -> tuple[jax.Array, Any, Any]:
        """`__call__` plus a `Routing` whose `experts` [layers, B, L - outputs_from, k] int32 are the
        routers' choices and `probs` [layers, B, L - outputs_from, E] their softmax; `replay`
        [layers, B, L, k] (-1 = route freely) makes the routers take those experts."""
        ...


@runtime_checkable
class ChunkUnembedding(Protocol):
    """A policy whose unembedding weight is made ready once for many chunks of one pass."""

    def unembedding(self) -> Callable[[jax.Array], jax.Array]:
        """`logits` with its weight made ready (e.g. gathered from its FSDP shards) once."""
        ...


@runtime_checkable
class LoopView(Protocol):
    """A policy whose weights a loop (a decode loop) can make ready once, before the loop."""

    def loop_view(self) -> Callable[[], Any]:
        """What the loop's body calls to get the policy (rl_models' layers out of their stacks)."""
        ...


@runtime_checkable
class DecodeCache(Protocol):
    """A policy with a cache for callers that write each slot once, in order from slot 0."""

    def init_decode_cache(self, batch_size: int, max_len: int) -> Any:
        """A zeroed decode cache (rl_models' keep only a ring of each windowed layer's window)."""
        ...

    def decode_cache_axes(self) -> Any:
        """The decode cache's logical axes, as `cache_axes` gives the cache's."""
        ...


# -- a paged adapter's (`model` is the policy's inference copy) ----------------------------------


@runtime_checkable
class RoutedPaging(Protocol):
    """A paged adapter that reports the experts a mixture's routers chose."""

    def forward_routed(self, model: Any, tokens: jax.Array, positions: jax.Array, pages: Any,
                       page_rows: jax.Array, kv: Any, **state: Any) -> tuple[jax.Array, Any, jax.Array | None]:
        """`forward` plus the experts (None for a dense model); with a `state_spec` it takes the same
        state arguments and returns (hidden, (pages, states), experts)."""
        ...


@runtime_checkable
class WindowedPaging(Protocol):
    """A paged adapter whose model may read only a window of keys behind each query."""

    def kv_window(self, model: Any) -> int | None:
        """The most key slots any layer reads behind a query when every layer is windowed (None
        otherwise): the engine then frees the pages behind it."""
        ...


@runtime_checkable
class StatefulPaging(Protocol):
    """A paged adapter whose model may keep a fixed-size recurrent state per sequence."""

    def state_spec(self, model: Any, max_tokens: int | None = None) -> Any:
        """One sequence's state (a tuple of ShapeDtypeStruct, each [layers, ...]; None: the model has
        none) for sequences of at most `max_tokens` positions. The engine then keeps a pool of such
        states ([layers, Q, ...] each) and calls `forward(..., states=pool, state_rows=[N] int32,
        sequence=bool)`, which returns (hidden, (pages, states)): `sequence` True for a prefill chunk
        (one sequence's consecutive tokens, real ones first), False for decoding (one token each of N
        sequences); row 0 is scratch (padding), and a token at position 0 starts its state afresh.
        (rl_models' states: Qwen3.5's linear-attention states, and the window-sized key/value rings of
        the windowed layers of a model that also has global layers, Gemma 3's.)"""
        ...


@runtime_checkable
class ShardedStates(Protocol):
    """A stateful paged adapter that says how to split its states over devices."""

    def state_axes(self, model: Any) -> Any:
        """The logical axis names of each `state_spec` leaf (None: each replica keeps its states whole)."""
        ...


@runtime_checkable
class ChunkSharingStates(Protocol):
    """A stateful paged adapter whose prefill chunks may hold several fresh sequences."""

    def fresh_states_share_chunks(self, model: Any) -> bool:
        """True when a prefill chunk may hold, after its first sequence, more sequences that start at
        position 0 (each by its own state row; rl_models' rings: yes; a linear-attention state: no,
        one sequence a chunk). Without it: one sequence a chunk."""
        ...


@runtime_checkable
class LoopStackedPaging(Protocol):
    """A paged adapter whose `forward` reads layer-stacked parameters one slice at a time."""

    def loop_stacks(self, model: Any) -> tuple[str, ...]:
        """The top-level parameter entries whose leaves are stacked on a leading layer axis; the
        engine keeps them as one array per layer so that no call copies them (rl_core.rollout.unstacked)."""
        ...


__all__ = ["ChunkSharingStates", "ChunkUnembedding", "DecodeCache", "LoopStackedPaging", "LoopView",
           "RoutedPaging", "RoutedPolicy", "ShardedStates", "StatefulPaging", "WindowedPaging"]
