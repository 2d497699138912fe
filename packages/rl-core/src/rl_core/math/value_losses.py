"""The critic's loss per token (unreduced; aggregation is separate).

PPO's clipped value loss (arXiv:1707.06347's implementation in OpenAI baselines,
as verl, OpenRLHF and Tunix use it), per token with V the critic's value now,
V_old its value when the rollout was collected and G the return:

    l_t = 1/2 max((V_t - G_t)^2, (V_old,t + clip(V_t - V_old,t, -c, c) - G_t)^2)

The clipped term keeps one update from moving a value more than c from where it
was (the max makes the bound pessimistic: it only ever raises the loss, and where
it is active the gradient is zero). c = None is the plain squared error.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def clipped_value_loss(values: jax.Array, old_values: jax.Array, returns: jax.Array, mask: jax.Array, *,
                       clip: float | None) -> tuple[jax.Array, jax.Array]:
    """(loss [B, T], clipped [B, T]): the loss above, and 1.0 where its clipped term is the
    larger (the bound binds); both 0 at masked positions."""
    if isinstance(clip, (int, float)) and not clip > 0:
        raise ValueError(f"the value clip c must be > 0 (None turns clipping off), got {clip}")
    real = jnp.asarray(mask) > 0
    unclipped = jnp.square(values - returns)
    if clip is None:
        loss, clipped = unclipped, jnp.zeros_like(unclipped)
    else:
        moved = old_values + jnp.clip(values - old_values, -clip, clip)
        bounded = jnp.square(moved - returns)
        loss = jnp.maximum(unclipped, bounded)
        clipped = (bounded > unclipped).astype(unclipped.dtype)
    return jnp.where(real, 0.5 * loss, 0.0), jnp.where(real, clipped, 0.0)
