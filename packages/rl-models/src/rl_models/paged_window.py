"""Window-sized keys and values for the windowed layers of a model that also has global layers
(Gemma 3's five `sliding_attention` layers to one `full_attention`, gpt-oss's alternating ones)
in the paged engine: its global layers keep the paged KV (rl_models.paged), its windowed layers a
ring of W slots per sequence in the engine's pool of per-sequence state rows (the rows Qwen3.5's
linear-attention states live in: rl_models.paged_hybrid), so a sequence's windowed layers hold W
slots whatever its length.

Shapes: N tokens, Lw windowed layers, Q state rows, W ring slots (the largest window, or the
longest sequence when that is shorter), K kv heads.

The ring pool is (keys, values), each [Lw, Q, W, K, Dh] in the compute dtype; row 0 is scratch.
Position p of a sequence lives in slot p mod W of its row; a query at position p reads the slots
whose last written position lies in p - window + 1 .. p (a slot's position follows from p: no
position is stored). A call is one of the engine's two kinds (`rl_core.policy.protocols.PagedModel`):
- `sequence=True`, a prefill chunk (sequences' consecutive tokens, real ones first: the first may
  continue a sequence, those after it start at position 0, `fresh_states_share_chunks`): the first
  sequence's queries read its row as it was (the positions before the chunk), every query the
  chunk's own keys of its sequence; then each row keeps its sequence's last W keys; so a chunk
  longer than the window needs no larger ring;
- `sequence=False`, decoding (one token of each of N sequences): each token is written into its row,
  then read with the W slots before it.
The positions fix which slots count, so a row taken over from another sequence needs no clearing
(a sequence writes every position from 0, and a token at position 0 sees nothing before it).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from rl_models import transformer as tf
from rl_models.attention import soft_capped
from rl_models.rings import held_slots


RING_AXES = ("layers", None, "kv_heads", "head_dim")
"""Logical axes of a ring leaf [Lw, W, K, Dh] (its kv heads split over `tensor` on a mesh)."""


def windowed_layers(config: tf.TransformerConfig) -> tuple[bool, ...] | None:
    """Which layers keep a ring when some layers are windowed and some global (not a hybrid); None
    otherwise (no window, or every layer windowed: the engine frees pages behind the window)."""
    windows = tf.layer_windows(config)
    if config.hybrid or not windows or tf.FULL_WINDOW not in windows or set(windows) == {tf.FULL_WINDOW}:
        return None
    return tuple(w != tf.FULL_WINDOW for w in windows)


def ring_spec(model: tf.Transformer, max_tokens: int | None = None
              ) -> tuple[jax.ShapeDtypeStruct, jax.ShapeDtypeStruct] | None:
    """(keys, values) of one sequence's rings, each [Lw, W, K, Dh] in the compute dtype; None unless
    the model mixes windowed and global layers (`windowed_layers`). W is the largest window, or
    `max_tokens` when no sequence is longer (the ring then never wraps)."""
    cfg = model.config
    windowed = windowed_layers(cfg)
    if windowed is None:
        return None
    w = max(x for x in tf.layer_windows(cfg) if x != tf.FULL_WINDOW)
    w = w if max_tokens is None else min(w, max_tokens)
    shape = jax.ShapeDtypeStruct((sum(windowed), w, cfg.num_kv_heads, cfg.head_dim), tf.compute_dtype(cfg))
    return shape, shape


def _softmax_out(q: jax.Array, k: jax.Array, v: jax.Array, valid: jax.Array, sinks: jax.Array | None,
                 softcap: float | None = None) -> jax.Array:
    """q [N, H, Dh] over keys/values [N, S, K, Dh] (each query its own) or [S, K, Dh] (shared: one
    sequence's, never copied per query) where `valid` [N, S]: [N, H, Dh]; scores scaled by
    1/sqrt(Dh) and a float32 softmax, as the paged attention computes them; `sinks` [H]: each
    head's sink logit joins the denominator; `softcap` soft-caps the scores before the mask."""
    n, h, dh = q.shape
    kvh = k.shape[-2]
    keys = "skd" if k.ndim == 3 else "nskd"
    qg = q.reshape(n, kvh, h // kvh, dh)
    s = soft_capped(jnp.einsum(f"nkgd,{keys}->nkgs", qg, k, preferred_element_type=jnp.float32) / math.sqrt(dh),
                    softcap)
    s = jnp.where(valid[:, None, None, :], s, -jnp.inf)
    top = jnp.max(s, axis=-1)
    if sinks is not None:
        top = jnp.maximum(top, jnp.asarray(sinks, jnp.float32).reshape(1, kvh, h // kvh))
    top = jnp.where(jnp.isfinite(top), top, 0.0)
    p = jnp.exp(s - top[..., None])
    total = jnp.sum(p, axis=-1)
    if sinks is not None:
        total = total + jnp.exp(jnp.asarray(sinks, jnp.float32).reshape(1, kvh, h // kvh) - top)
    total = jnp.where(total > 0, total, 1.0)  # a padding query may see nothing: 0, never 0/0 (NaN keys would spread)
    out = jnp.einsum(f"nkgs,{keys}->nkgd", p.astype(v.dtype), v, preferred_element_type=jnp.float32)
    return (out / total[..., None]).reshape(n, h, dh).astype(q.dtype)


def ring_attention(q: jax.Array, k: jax.Array, v: jax.Array, rings: tuple[jax.Array, jax.Array], layer: int,
                   rows: jax.Array, positions: jax.Array, window: int, *, sequence: bool,
                   sinks: jax.Array | None = None, softcap: float | None = None
                   ) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
    """q [N, H, Dh], k / v [N, K, Dh] of tokens at `positions` [N] in state rows `rows` [N] (0:
    padding) -> (out [N, H, Dh], rings with their keys and values written); `layer` indexes the
    windowed layers; each query reads its last `window` positions (see the module docstring)."""
    k_ring, v_ring = rings
    w = k_ring.shape[2]
    if sequence:  # a chunk: its first sequence's ring before it, then the chunk's own keys
        first_row, first = rows[0], positions[0]
        old_k, old_v = k_ring[layer, first_row], v_ring[layer, first_row]  # [W, K, Dh]
        held = held_slots(first - 1, w)  # the position each slot holds before the chunk
        keys = jnp.concatenate([old_k.astype(k.dtype), k])  # [W + N, K, Dh]
        values = jnp.concatenate([old_v.astype(v.dtype), v])
        key_pos = jnp.concatenate([held, positions])
        # the ring is the first sequence's; the chunk's other sequences start at position 0 (nothing
        # to read: the scheduler adds only such prompts after the first), each keyed by its own row
        mine = jnp.concatenate([jnp.broadcast_to(rows[0], (w,)), rows])  # [W + N]: whose each key is
        key_ok = jnp.concatenate([held >= 0, rows > 0])
        low = positions[:, None] - window + 1
        valid = (key_ok[None] & (mine[None] == rows[:, None]) & (key_pos[None] >= low)
                 & (key_pos[None] <= positions[:, None]))
        out = _softmax_out(q, keys, values, valid, sinks, softcap)
        # each sequence's ring takes its last W tokens of the chunk (distinct slots) and keeps the rest
        same = rows[:, None] == rows[None, :]
        last = jnp.max(jnp.where(same, positions[None, :], -1), axis=1)  # [N]: its sequence's last position
        kept = (rows > 0) & (positions > last - w)
        at = jnp.where(kept, rows, 0)  # the others write scratch row 0
        slot = jnp.mod(positions, w)
        return out, (k_ring.at[layer, at, slot].set(k.astype(k_ring.dtype)),
                     v_ring.at[layer, at, slot].set(v.astype(v_ring.dtype)))
    slot = jnp.mod(positions, w)
    k_ring = k_ring.at[layer, rows, slot].set(k.astype(k_ring.dtype))
    v_ring = v_ring.at[layer, rows, slot].set(v.astype(v_ring.dtype))
    keys, values = k_ring[layer, rows], v_ring[layer, rows]  # [N, W, K, Dh]
    held = held_slots(positions[:, None], w)  # [N, W]
    valid = (held >= 0) & (held > positions[:, None] - window)
    return _softmax_out(q, keys, values, valid, sinks, softcap), (k_ring, v_ring)

