"""Gemma 4 (rl_models.gemma4.Gemma4Transformer) on the paged engine: as a model mixing windowed and
global layers (rl_models.paged_window), its global layers keep the paged KV and its windowed layers
a ring of W slots per sequence in the engine's state rows; only the layers that compute keys and
values have either (`gemma4.cache_layers`), so the pool holds the global ones of those, at the
global layers' own KV heads and head size, and the rings the windowed ones.

A layer that shares another's keys and values (the last `kv_shared_layers`) attends over its
source's: over the pool, it writes the source's keys and values of the call's tokens again into the
source's pages (the same values in the same slots) and reads them; over a ring it reads the ring
as it was before the source wrote the call (a prefill chunk's attention reads the ring before the
chunk, then the chunk's own keys) and keeps the source's written ring.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from rl_models import gemma4, paged_window
from rl_models import transformer as tf
from rl_models.rope import rotate


def _kv_layers(config: tf.TransformerConfig) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(the global layers with their own keys and values, the windowed ones), in model order."""
    owners, windowed = gemma4.cache_layers(config), config.windowed()
    return tuple(i for i in owners if not windowed[i]), tuple(i for i in owners if windowed[i])


def pool_spec(model: gemma4.Gemma4Transformer) -> tuple[int, int, int, Any]:
    """(layers, kv heads, head dim, dtype) of the key/value pool: the global layers that compute
    keys and values, at the global layers' shape."""
    cfg = model.config
    full, _ = _kv_layers(cfg)
    if not full:
        raise NotImplementedError("a layered model on the paged engine needs a full-attention layer")
    kv, dh = cfg.layer_shape(full[0])
    return len(full), kv, dh, tf.compute_dtype(cfg)


def ring_spec(model: gemma4.Gemma4Transformer, max_tokens: int | None = None
              ) -> tuple[jax.ShapeDtypeStruct, jax.ShapeDtypeStruct] | None:
    """(keys, values) of one sequence's rings, each [Lw, W, K, Dh]: the windowed layers that compute
    keys and values; W the window, or `max_tokens` when no sequence is longer. None with no such layer."""
    cfg = model.config
    _, windowed = _kv_layers(cfg)
    if not windowed:
        return None
    w = cfg.sliding_window if max_tokens is None else min(cfg.sliding_window, max_tokens)  # type: ignore[type-var]
    shape = jax.ShapeDtypeStruct((len(windowed), w, cfg.num_kv_heads, cfg.head_dim), tf.compute_dtype(cfg))
    return shape, shape


def paged_layered_forward(model: gemma4.Gemma4Transformer, tokens: jax.Array, positions: jax.Array, pages: Any,
                          page_rows: jax.Array, kv: Any, *, states: Any = None, state_rows: jax.Array | None = None,
                          sequence: bool = False) -> tuple[jax.Array, Any, None]:
    """Hidden states [N, D] (after the final norm) of tokens [N] at positions [N], (the pool, the
    rings) with their keys and values written, and no routing (rl_models.paged.paged_forward_routed's
    contract for a model with rings)."""
    cfg = model.config
    full, windowed = _kv_layers(cfg)
    if windowed and (states is None or state_rows is None):
        raise ValueError("a model with windowed layers runs with their rings (states=, state_rows=)")
    n = tokens.shape[0]
    x = tf.embed_tokens(model, tokens)[:, None]  # [N, 1, D]
    per_layer = model._per_layer_inputs(tokens[:, None], x)
    ropes = model._ropes(positions[:, None])
    sources, kinds = cfg.kv_source(), cfg.windowed()
    splits = {s: nnx.split(getattr(model, s)) for s in gemma4.STACKS if getattr(model, s) is not None}
    computed: dict[int, tuple[jax.Array, jax.Array]] = {}
    rings_before: dict[int, tuple[jax.Array, jax.Array]] = {}
    extra = {} if cfg.attn_logit_softcapping is None else {"softcap": cfg.attn_logit_softcapping}

    def ring(q, k, v, rings, layer, window):
        return paged_window.ring_attention(q, k, v, rings, layer, state_rows, positions, window, sequence=sequence,
                                           **extra)

    for i, (stack, row) in enumerate(gemma4.layer_rows(cfg)):
        graphdef, state = splits[stack]
        block = nnx.merge(graphdef, jax.tree.map(lambda a, row=row: a[row], state))
        attn, rope, src = block.attn, ropes[kinds[i]], sources[i]
        h = block.attn_norm(x)
        dh = attn.q_proj.kernel.shape[-1] // cfg.num_heads
        q = attn.q_proj(h).reshape(n, 1, cfg.num_heads, dh)
        q = rotate(attn.q_norm(q) if attn.q_norm is not None else q, *rope)
        if cfg.query_scale is not None:  # the pool's and the rings' attention scale by 1 / sqrt(Dh): q carries the rest
            q = (q.astype(jnp.float32) * (cfg.query_scale * dh ** 0.5)).astype(q.dtype)
        if src == i:
            computed[i] = attn.keys_values(h, rope)
        k, v = (a[:, 0] for a in computed[src])
        if kinds[i]:
            slot = windowed.index(src)
            if src == i:
                rings_before[i] = (states[0][slot], states[1][slot])
                out, states = ring(q[:, 0], k, v, states, slot, cfg.sliding_window)
            else:  # the source's ring before it wrote this call; the ring it wrote stays
                before = tuple(r[None] for r in rings_before[src])
                out, _ = ring(q[:, 0], k, v, before, 0, cfg.sliding_window)
        else:
            out, pages = kv(q[:, 0], k, v, pages, jnp.int32(full.index(src)), page_rows, positions, **extra)
        o = attn.o_proj(out.reshape(n, 1, cfg.num_heads * dh).astype(x.dtype))
        x = block(x, o, None if per_layer is None else per_layer[:, :, i])
    return model.final_norm(x)[:, 0], (pages, states) if windowed else pages, None
