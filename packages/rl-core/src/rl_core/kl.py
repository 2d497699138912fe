"""Per-token KL estimators of KL(pi || pi_ref) from sampled tokens (Schulman, "Approximating KL Divergence").

With d = ref_logp - logp per token (tokens sampled from pi):

- "k1": -d                 unbiased, high variance, can be negative
- "k2": d^2 / 2            biased, low variance, >= 0
- "k3": exp(d) - d - 1     unbiased, low variance, >= 0 (GRPO's choice)

Each maps (logp [B, T], ref_logp [B, T]) -> [B, T], unreduced; the loss adds
beta * KL aggregated with the same mode as the policy loss. Values at padding
positions must be masked by the caller.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from rl_core.registry import register


def _log_ratio(logp: jax.Array, ref_logp: jax.Array) -> jax.Array:
    if jnp.shape(logp) != jnp.shape(ref_logp):
        raise ValueError(f"logp {jnp.shape(logp)} and ref_logp {jnp.shape(ref_logp)} must have the same shape")
    return ref_logp - logp


@register("kl_estimator", "k1")
def k1(logp: jax.Array, ref_logp: jax.Array) -> jax.Array:
    """k1 = -d = logp - ref_logp."""
    return -_log_ratio(logp, ref_logp)


@register("kl_estimator", "k2")
def k2(logp: jax.Array, ref_logp: jax.Array) -> jax.Array:
    """k2 = d^2 / 2."""
    d = _log_ratio(logp, ref_logp)
    return 0.5 * jnp.square(d)


@register("kl_estimator", "k3")
def k3(logp: jax.Array, ref_logp: jax.Array) -> jax.Array:
    """k3 = exp(d) - d - 1, computed as expm1(d) - d.

    expm1 avoids the cancellation of exp(d) - 1 for small d, where the
    estimator is O(d^2) and would otherwise lose most of its digits.
    """
    d = _log_ratio(logp, ref_logp)
    return jnp.expm1(d) - d
