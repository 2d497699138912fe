"""The small protocol through which rl_core talks to any model.

Shapes: B batch, L query tokens, S key/value slots, D hidden, V vocab.

A policy is a Flax NNX module whose state is all `nnx.Param` (so that
`nnx.split(model)` gives (graphdef, params) and optax can update params
directly). When some of them are `nnx.LoRAParam` (adapters), only those train and
the rest is a frozen base (see `rl_core.policy.frozen`). rl_core never imports a model package.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

import jax
import jax.numpy as jnp

from rl_core.policy.traits import ChunkUnembedding, DecodeCache, LoopView, RoutedPolicy

Cache = Any  # a pytree of arrays owned by the model; rl_core only threads it through.


@runtime_checkable
class Policy(Protocol):
    """A decoder-only language model.

    `__call__` runs the transformer body and returns hidden states, not
    logits, so that callers can unembed in chunks (see `rl_core.policy.logprobs`)
    and never materialize a [B, L, V] float32 array.
    """

    @property
    def vocab_size(self) -> int: ...

    def init_cache(self, batch_size: int, max_len: int) -> Cache:
        """A zeroed KV cache with `max_len` slots per row."""
        ...

    def cache_axes(self) -> Any:
        """The cache's tree with a `jax.sharding.PartitionSpec` of logical axis names
        per leaf: "batch" marks the rows (the sampler copies and splits them), the
        other names go through the same rules as the parameters'. The optional abilities beside
        these (a decode cache, routing, a loop view, a chunk unembedding) are rl_core.policy.traits'."""
        ...

    def __call__(
        self,
        tokens: jax.Array,  # [B, L] int32
        positions: jax.Array,  # [B, L] int32, rotary positions
        attention_mask: jax.Array,  # [B, L, S] bool, True = query may attend to slot
        cache: Cache | None = None,
        cache_index: jax.Array | int = 0,  # slot where tokens[:, 0] is written
        *,
        outputs_from: int = 0,  # static: the first position whose hidden state is returned
    ) -> tuple[jax.Array, Cache | None]:
        """Hidden states [B, L - outputs_from, D] of positions `outputs_from`.. and the
        updated cache (every position's keys/values). A model may skip work whose result
        only the earlier positions' outputs would need.

        Without a cache, S == L and slot j is token j. With a cache, the L new
        keys/values are written at slots [cache_index, cache_index + L) and
        the queries attend over all S cache slots under `attention_mask`.
        """
        ...

    def logits(self, hidden: jax.Array) -> jax.Array:
        """Unembed hidden states [..., D] to float32 logits [..., V]."""
        ...


def routed_call(policy: Any, *args: Any, replay: jax.Array | None = None, **kwargs: Any
                ) -> tuple[jax.Array, Cache | None, Any]:
    """`policy(*args, **kwargs)` and a mixture of experts' routing (None for a dense policy), through
    the policy's optional `routed(..., replay=)` (rl_models' transformers: `__call__` plus a `Routing`
    whose `experts` [layers, B, L - outputs_from, k] int32 are the routers' choices and `probs`
    [layers, B, L - outputs_from, E] their softmax). `replay` [layers, B, L, k] (every position of the
    call; -1 = route freely) makes the routers take those experts (routing replay); a policy that is
    no `RoutedPolicy` (rl_core.policy.traits) refuses one."""
    if not isinstance(policy, RoutedPolicy):
        if replay is not None:
            raise ValueError(f"routing replay: {type(policy).__name__} has no routed(), so it takes no experts to replay")
        hidden, cache = policy(*args, **kwargs)
        return hidden, cache, None
    return policy.routed(*args, replay=replay, **kwargs)


def chunk_unembedding(policy: Policy) -> Callable[[jax.Array], jax.Array]:
    """What unembeds many chunks of one pass: a `ChunkUnembedding` policy's `unembedding()` (a
    `logits` whose weight is made ready once, e.g. gathered from its FSDP shards),
    else `logits` itself."""
    return policy.unembedding() if isinstance(policy, ChunkUnembedding) else policy.logits


def loop_policy(policy: Any) -> Callable[[], Any]:
    """What a loop that runs `policy` at every iteration (a decode loop) calls inside its body
    to get the policy: a `LoopView` policy's `loop_view()` (its weights made ready once, before
    the loop, e.g. rl_models' layers taken out of their stacks), else the policy itself. Call
    this outside the loop."""
    return policy.loop_view() if isinstance(policy, LoopView) else (lambda: policy)


def repeat_cache(policy: Policy, cache: Cache, n: int, axes: Any = None) -> Cache:
    """`cache` with each row copied to n consecutive rows (its "batch" axis, `axes`, by default
    `cache_axes()`): a prompt's cache for each of its n samples (the sampler) or group rows (the
    scoring pass)."""
    return jax.tree.map(lambda x, names: jnp.repeat(x, n, axis=list(names).index("batch")), cache,
                        policy.cache_axes() if axes is None else axes)


def decode_cache(policy: Policy, batch_size: int, max_len: int) -> tuple[Cache, Any]:
    """(a zeroed cache, its axes) for a loop that writes each slot once, in order from slot 0 (the
    sampler): a `DecodeCache` policy's `init_decode_cache` and `decode_cache_axes` (rl_models' keep
    only a ring of each windowed layer's window), else `init_cache` and `cache_axes`."""
    if isinstance(policy, DecodeCache):
        return policy.init_decode_cache(batch_size, max_len), policy.decode_cache_axes()
    return policy.init_cache(batch_size, max_len), policy.cache_axes()


@runtime_checkable
class PagedModel(Protocol):
    """How the paged rollout engine (rl_core.rollout.paged) runs a kind of policy: an adapter
    the engine's builder passes next to the policy (rl_models.PAGED_TRANSFORMER for
    rl_models' transformers, plain, LoRA or QLoRA), so the model needs no engine methods.

    Shapes: N tokens, each its own query; M pages per sequence.

    Optional abilities, one protocol each in rl_core.policy.traits: `RoutedPaging` (the experts
    chosen), `WindowedPaging` (a key window), `StatefulPaging` (a recurrent state per sequence)
    with `ShardedStates` and `ChunkSharingStates`, and `LoopStackedPaging` (layer-stacked weights).
    """

    def cache_spec(self, model: Policy) -> tuple[int, int, int, Any]:
        """(layers, kv heads, head dim, dtype) of the key/value pool for `model`."""
        ...

    def forward(
        self,
        model: Policy,
        tokens: jax.Array,  # [N] int32
        positions: jax.Array,  # [N] int32, position of each token in its sequence
        pages: Cache,  # the pool, laid out by `kv`
        page_rows: jax.Array,  # [N, M] int32, the page table of each token's sequence
        kv: Any,  # rl_core.rollout.attention.PagedKV
    ) -> tuple[jax.Array, Cache]:
        """Hidden states [N, D] (as the policy's `__call__` returns them) and the pool. In each
        layer `out, pages = kv(q [N, H, Dh], k [N, K, Dh], v [N, K, Dh], pages, layer, page_rows,
        positions)` writes the tokens' keys/values and attends over slots 0..position."""
        ...

    def inference_copy(self, model: Policy) -> Policy:
        """A module computing what `model` computes with every weight in the compute dtype and
        adapters merged (traceable; the engine's inference weights). `cache_spec` and `forward`
        receive such copies."""
        ...


@runtime_checkable
class ValueFunction(Protocol):
    """A critic: the value of each prefix of a sequence (rl_models.value.ValueModel).

    Like a policy it is an NNX module of `nnx.Param`s (with adapters, it trains them and
    its head over a frozen base; see `rl_core.policy.frozen`).
    """

    def __call__(
        self,
        tokens: jax.Array,  # [B, L] int32
        positions: jax.Array,  # [B, L] int32
        attention_mask: jax.Array,  # [B, L, L] bool, True = query may attend to slot
        token_logp: jax.Array | None = None,  # [B, L] behaviour log-prob of each token, 0 where not sampled
        *,
        outputs_from: int = 0,  # static: the first position whose value is returned
    ) -> jax.Array:
        """Float32 values [B, L - outputs_from] of positions `outputs_from`..: entry j estimates
        the return of the sequence given tokens 0..j (and, for a critic that reads them, the
        policy's log-probs of those tokens)."""
        ...
