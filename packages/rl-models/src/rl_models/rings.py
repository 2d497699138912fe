"""Window-sized key/value rings for the windowed layers of a decode cache.

Shapes: B rows, K KV heads, R ring slots, L tokens of a call, Lq its queries, S the sequence's
slots (the caller's mask covers S), Dh head dim.

A windowed layer's query at slot q sees the key slots q - W + 1..q only (rl_models.block.
within_window). A caller that writes each slot once and in order from slot 0 (the static sampler:
prefill at 0, then one token per step) never needs a windowed layer's older slots again, so its
cache (`Transformer.init_decode_cache`) gives each such layer a ring of R = min(W, S) slots: slot
s lives in ring entry s mod R, overwritten when slot s + R is written. Padding does not break
this: a left-padded row's real tokens sit in consecutive slots (slot distance is position
distance) and its pad slots are masked by the caller's mask, which the ring reads by slot.

A call of L tokens at slot c:
- L == 1 (decoding): its key is written first, then the query reads the whole ring, whose entry
  j then holds slot c - ((c - j) mod R) (`held_slots`); R >= W keeps every slot the window needs.
- L > 1 (prefill): its queries read the ring's slots before c (none when c == 0) and the call's
  own L keys, then the ring keeps the last R of them (`write_call`).
Either way each key is masked as the full cache would mask its slot (the caller's mask at that
slot, the window by slot distance), so the attention is the full cache's over fewer slots.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp


class RingKV(NamedTuple):
    """A scanned model's decode cache with windowed layers: the global layers' (k, v), each
    [n_global, B, K, S, Dh] (None when every layer is windowed), and the windowed layers' rings
    (k, v), each [n_windowed, B, K, R, Dh]; a layer's row is its index among layers of its kind."""

    full: tuple[jax.Array, jax.Array] | None
    ring: tuple[jax.Array, jax.Array]


def ring_size(window: int, slots: int) -> int:
    """A windowed layer's ring for a sequence of `slots` slots: its window, or the whole sequence
    when that is shorter."""
    return min(window, slots)


def held_slots(cache_index: jax.Array | int, r: int) -> jax.Array:
    """[R] int32: the slot each ring entry holds once slots ..cache_index are written (the latest
    slot <= cache_index congruent to the entry mod R; negative: never written)."""
    c = jnp.asarray(cache_index, jnp.int32)
    j = jnp.arange(r, dtype=jnp.int32)
    return c - jnp.mod(c - j, r)


def key_mask(mask: jax.Array, key_slots: jax.Array, query_slots: jax.Array, window: int) -> jax.Array:
    """[B, Lq, N] mask of keys at `key_slots` [N] (negative: empty) for queries at `query_slots`
    [Lq], from the caller's mask [B, Lq, S] by slot, kept to each query's window."""
    seen = jnp.take(mask, jnp.maximum(key_slots, 0), axis=2, mode="clip")
    near = (query_slots[:, None] - key_slots[None, :] < window) & (key_slots >= 0)[None, :]
    return seen & near[None]


def write_call(ring: jax.Array, new: jax.Array, cache_index: jax.Array | int) -> jax.Array:
    """`ring` [B, K, R, Dh] after a call wrote `new` [B, K, L, Dh] at slots cache_index..: each
    entry takes the call's latest slot that maps to it, or keeps what it held."""
    r, length = ring.shape[2], new.shape[2]
    last = jnp.asarray(cache_index, jnp.int32) + length - 1
    slot = held_slots(last, r)  # [R]
    offset = slot - (last - length + 1)  # the slot's place in the call (negative: before it)
    taken = jnp.take(new, jnp.clip(offset, 0, length - 1), axis=2)
    return jnp.where((offset >= 0)[None, None, :, None], taken.astype(ring.dtype), ring)


def repeating_period(flags: tuple[bool, ...]) -> int:
    """The shortest p with flags[i] == flags[i % p] for every layer i (Gemma 3: 6; every layer
    alike: 1); the layers past the last whole group follow the group's first ones."""
    n = len(flags)
    return next(p for p in range(1, n + 1) if all(flags[i] == flags[i % p] for i in range(n)))


def scan_ring_layers(layer: Callable[..., tuple[jax.Array, Any, Any]], x: jax.Array, cache: RingKV,
                     flags: tuple[bool, ...], replay: jax.Array | None, first: int = 0,
                     rows_before: tuple[int, int] = (0, 0)) -> tuple[jax.Array, RingKV, Any]:
    """Layers first..first + len(flags) - 1 (`flags`: each windowed or not) in order over a `RingKV`,
    as one `lax.scan` over the repeating group of layer kinds (`repeating_period`; its members
    unrolled in the body, so each knows its kind statically), then the layers past the last whole
    group the same way (Gemma 3 1B's 26 layers: 4 groups of 6, then a scan over 2 windowed layers;
    a loop, not layers at the program's top level, where XLA:CPU keeps more of them alive at once).

    `layer(x, kv, i, windowed, row, replay_i)` runs layer i (traced), of the kind `windowed`
    (static), on the stack `kv` of its kind at `row`, and returns (x, kv, routing). `rows_before`:
    the (windowed, global) layers before `first`. Returns x, the cache and the routing stacked over
    the layers in model order (None without experts)."""
    n = len(flags)
    p = repeating_period(flags)
    groups, rest = divmod(n, p)
    per_group = (sum(flags[:p]), p - sum(flags[:p]))  # windowed, global layers in a group
    before = [(sum(flags[:j]), j - sum(flags[:j])) for j in range(p)]  # of each kind before member j

    def run(x, cache: RingKV, g, j):
        windowed = flags[j]
        kind = int(not windowed)
        row = rows_before[kind] + g * per_group[kind] + before[j][kind]
        kv = cache.ring if windowed else cache.full
        # layer i's weights are sliced out of their stacks after layer i - 1 has run (the barrier ties
        # i to x), so one layer's slices are live at a time, not the whole group's
        x, i = jax.lax.optimization_barrier((x, first + g * p + j))
        replay_i = None if replay is None else jax.lax.dynamic_index_in_dim(replay, i, 0, False)
        x, kv, routing = layer(x, kv, i, windowed, row, replay_i)
        cache = cache._replace(ring=kv) if windowed else cache._replace(full=kv)
        return x, cache, routing

    def body(carry, g):
        x, cache = carry
        routings = []
        for j in range(p):
            x, cache, routing = run(x, cache, g, j)
            routings.append(routing)
        return (x, cache), jax.tree.map(lambda *a: jnp.stack(a), *routings)

    (x, cache), routing = jax.lax.scan(body, (x, cache), jnp.arange(groups, dtype=jnp.int32))
    routing = jax.tree.map(lambda a: a.reshape(groups * p, *a.shape[2:]), routing)
    if rest:
        done = (rows_before[0] + groups * per_group[0], rows_before[1] + groups * per_group[1])
        x, cache, tail = scan_ring_layers(layer, x, cache, flags[groups * p:], replay, first + groups * p, done)
        routing = jax.tree.map(lambda a, t: jnp.concatenate([a, t]), routing, tail)
    return x, cache, routing
