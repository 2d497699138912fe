"""Per-token KL estimators of KL(pi || pi_ref) from sampled tokens (Schulman, "Approximating KL Divergence").

With d = ref_logp - logp per token (tokens sampled from pi):

- "k1": -d                 unbiased, high variance, can be negative
- "k2": d^2 / 2            biased, low variance, >= 0
- "k3": exp(d) - d - 1     unbiased, low variance, >= 0 (GRPO's choice); bounded as verl
                           bounds it: d clamped to [-20, 20], the result to at most 10

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


K3_LOG_RATIO_BOUND = 20.0
"""k3 clamps d to [-20, 20] first (verl's kl_penalty "low_var_kl"): exp(d) stays finite."""

K3_MAX = 10.0
"""k3 is capped at 10 (verl's clamp): one token far below the reference (exp(25) = 7e10)
cannot dominate the update, and its gradient past the cap is 0, not inf."""


@register("kl_estimator", "k3")
def k3(logp: jax.Array, ref_logp: jax.Array) -> jax.Array:
    """k3 = exp(d) - d - 1, computed as expm1(d) - d, with d clamped to [-20, 20] and the
    result to at most 10 (verl's bounds).

    expm1 avoids the cancellation of exp(d) - 1 for small d, where the
    estimator is O(d^2) and would otherwise lose most of its digits. The bounds
    keep the value and its gradient finite everywhere, so a masked position
    holding any log-prob (even -inf) contributes 0 x finite = 0 to the backward
    pass, never 0 x inf = NaN.
    """
    d = jnp.clip(_log_ratio(logp, ref_logp), -K3_LOG_RATIO_BOUND, K3_LOG_RATIO_BOUND)
    return jnp.minimum(jnp.expm1(d) - d, K3_MAX)
