"""The router's auxiliary load-balancing loss of a mixture of experts.

Shapes: E experts, k chosen per token; any leading axes (layers, B, T) are pooled.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def load_balancing_loss(probs: jax.Array, experts: jax.Array, mask: jax.Array | None = None) -> jax.Array:
    """Switch Transformer's auxiliary loss (Fedus et al. 2021, arXiv:2101.03961), E * sum_e f_e * P_e,
    as transformers computes it for Qwen3-MoE and gpt-oss (every layer's tokens pooled): f_e is the
    share of tokens that chose expert e (summed over the k choices, so sum_e f_e = k) and P_e the
    mean router probability of e. probs [..., E] float32, experts [..., k] int32, mask broadcast to
    [...] (1 = a real token; None: every token). Uniform routing gives k; every token sent to the
    same k experts with certainty gives E."""
    e = probs.shape[-1]
    flat_probs = probs.reshape(-1, e).astype(jnp.float32)
    chosen = jax.nn.one_hot(experts.reshape(-1, experts.shape[-1]), e, dtype=jnp.float32).sum(axis=1)  # [N, E]
    m = jnp.ones(flat_probs.shape[:1], jnp.float32) if mask is None else jnp.broadcast_to(
        jnp.asarray(mask, jnp.float32), experts.shape[:-1]).reshape(-1)
    count = jnp.maximum(jnp.sum(m), 1.0)
    f = jnp.sum(chosen * m[:, None], axis=0) / count
    p = jnp.sum(flat_probs * m[:, None], axis=0) / count
    return e * jnp.sum(f * p)
