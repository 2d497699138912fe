"""Qwen3.5's full-attention layer: grouped-query attention with q/k RMSNorm, rotary positions
on the first `rotary_dim` dims of each head only (partial rotary), and an output gate: q_proj
gives each head its query and a gate, and the attention output is multiplied by
sigmoid(gate) before o_proj (transformers' Qwen3_5Attention).

Shapes as in rl_models.transformer. The KV cache is the transformer's: a stacked (k, v)
whose slice `layer` this layer writes and reads.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from rl_models.attention import attend, attend_sequence
from rl_models.block import Attention, KVCache, compute_dtype, param_dtype, write_cache
from rl_models.config import TransformerConfig
from rl_models.layers import Linear
from rl_models.rope import rotate
from rl_models.sharding import constrain


rotate_partial = rotate
"""x [B, L, N, Dh] with its first cos.shape[-1] dims rotated, the rest as they are (`rotate` takes partial tables)."""


class GatedAttention(Attention):
    """`Attention` with a per-head output gate from q_proj (its output is [q_h, gate_h] per
    head h) and partial rotary; q/k norms always (config.qk_norm)."""

    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
        super().__init__(config, rngs=rngs)
        d, h, dh = config.hidden_size, config.num_heads, config.head_dim
        assert dh is not None
        self.q_proj = Linear(d, h * 2 * dh, axes=("embed", "heads"), use_bias=config.attention_bias,
                             units=(1, 2 * dh), dtype=compute_dtype(config), param_dtype=param_dtype(config),
                             rngs=rngs)

    def __call__(self, x: jax.Array, rope: tuple[jax.Array, jax.Array], mask: jax.Array,
                 kv: KVCache | None, cache_index: jax.Array | int, layer: jax.Array,
                 queries_from: int = 0) -> tuple[jax.Array, KVCache | None]:
        cfg = self.config
        b, l, _ = x.shape
        h, kvh, dh = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        lq = l - queries_from
        qg = self.q_proj(x[:, queries_from:]).reshape(b, lq, h, 2 * dh)
        q, gate = qg[..., :dh], qg[..., dh:].reshape(b, lq, h * dh)
        k, v = self.k_proj(x).reshape(b, l, kvh, dh), self.v_proj(x).reshape(b, l, kvh, dh)
        q = constrain(q, ("act_batch", "act_length", "act_heads", None))
        k, v = (constrain(t, ("act_batch", "act_length", "act_kv_heads", None)) for t in (k, v))
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = rotate_partial(q, *(r[:, queries_from:] for r in rope)), rotate_partial(k, *rope)
        mask = mask[:, queries_from:]
        if kv is None:
            out = attend_sequence(q, k, v, mask, cfg.attention, offset=queries_from)
        else:
            kv, k_all, v_all = write_cache(kv, k, v, layer, cache_index)
            out = attend(q, k_all, v_all, mask)
        out = out * jax.nn.sigmoid(gate.astype(jnp.float32)).astype(out.dtype)
        return self.o_proj(constrain(out, ("act_batch", "act_length", "act_heads"))), kv
