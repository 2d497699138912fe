"""Per-token policy-gradient losses (unreduced; aggregation is separate).

`clipped_surrogate` is PPO's clipped objective (arXiv:1707.06347) with
separate lower and upper clip widths, so one function serves GRPO
(eps_low = eps_high = 0.2, arXiv:2402.03300) and DAPO's clip-higher
(eps_low = 0.2, eps_high = 0.28, arXiv:2503.14476), plus optional dual clip
(arXiv:1912.09729). Per token, with rho_t = exp(logp_t - old_logp_t):

    l_t = -min(rho_t A, clip(rho_t, 1 - eps_low, 1 + eps_high) A)

Every policy loss is called as `fn(logp, old_logp, adv, mask, *, eps_low,
eps_high, dual_clip)` and returns per-token losses [B, T] together with
per-token diagnostics; the caller aggregates both with the mask
(rl_core.aggregation). The log-ratio is zeroed at masked positions before the
exponent and bounded to +-LOG_RATIO_BOUND, so garbage in padding (or a
runaway ratio) can never make the loss or its gradient non-finite.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from rl_core.registry import register

LOG_RATIO_BOUND = 20.0
"""|logp - old_logp| is clipped here before the exponent (exp(20) ~ 5e8, as Tunix does)."""


def log_ratio(logp: jax.Array, old_logp: jax.Array, mask: jax.Array) -> jax.Array:
    """logp - old_logp [B, T], exactly 0 at masked positions and bounded to +-LOG_RATIO_BOUND.

    `jnp.where` passes no gradient to the masked branch, so inf or NaN there cannot
    reach the parameters through the exponent.
    """
    diff = jnp.where(mask > 0, logp - old_logp, 0.0)
    return jnp.clip(diff, -LOG_RATIO_BOUND, LOG_RATIO_BOUND)


class PolicyLossAux(NamedTuple):
    """Per-token diagnostics, float [B, T], unreduced (aggregate them with the mask)."""

    ratio: jax.Array
    """rho_t = exp(logp_t - old_logp_t), bounded; 1 at masked positions."""
    clipped_low: jax.Array
    """1.0 where the lower bound is the active term: A < 0 and rho < 1 - eps_low."""
    clipped_high: jax.Array
    """1.0 where the upper bound is the active term: A > 0 and rho > 1 + eps_high."""
    dual_clipped: jax.Array
    """1.0 where A < 0 and the dual-clip bound c*A is active; zeros without dual clip."""


def _check_scalars(eps_low: float, eps_high: float, dual_clip: float | None) -> None:
    """Validate the clip widths when they are concrete Python numbers."""
    if isinstance(eps_low, (int, float)) and not 0.0 <= eps_low < 1.0:
        raise ValueError(f"eps_low must be in [0, 1) so that 1 - eps_low > 0, got {eps_low}")
    if isinstance(eps_high, (int, float)) and not eps_high >= 0.0:
        raise ValueError(f"eps_high must be >= 0, got {eps_high}")
    if isinstance(dual_clip, (int, float)) and not dual_clip > 1.0:
        raise ValueError(f"dual_clip must be > 1 (it bounds the loss at c * |A| for A < 0), got {dual_clip}")


@register("policy_loss", "clipped_surrogate")
@register("policy_loss", "grpo")
def clipped_surrogate(
    logp: jax.Array,
    old_logp: jax.Array,
    adv: jax.Array,
    mask: jax.Array,
    *,
    eps_low: float,
    eps_high: float,
    dual_clip: float | None = None,
) -> tuple[jax.Array, PolicyLossAux]:
    """Clipped surrogate loss per token.

    logp, old_logp: float [B, T]; adv: float [B] (one advantage per completion);
    mask: float [B, T], 1 = token in the loss.
    Returns (loss float [B, T], PolicyLossAux). With `dual_clip` = c > 1, tokens
    with A < 0 use max(min(rho A, clip(rho) A), c A): a very large ratio on a bad
    action cannot produce an unbounded loss.
    """
    _check_scalars(eps_low, eps_high, dual_clip)
    if jnp.shape(logp) != jnp.shape(old_logp):
        raise ValueError(f"logp {jnp.shape(logp)} and old_logp {jnp.shape(old_logp)} must have the same shape [B, T]")
    if jnp.shape(mask) != jnp.shape(logp):
        raise ValueError(f"mask {jnp.shape(mask)} must have the shape of logp {jnp.shape(logp)}")
    if jnp.ndim(adv) != 1 or jnp.shape(adv)[0] != jnp.shape(logp)[0]:
        raise ValueError(f"adv must be [B] with B = {jnp.shape(logp)[0]}, got shape {jnp.shape(adv)}")

    ratio = jnp.exp(log_ratio(logp, old_logp, mask))
    a = jnp.asarray(adv, ratio.dtype)[:, None]  # every token of a completion shares its advantage
    unclipped = ratio * a
    clipped = jnp.clip(ratio, 1.0 - eps_low, 1.0 + eps_high) * a
    # The pessimistic (smaller) objective: the clipped term is constant in rho,
    # so its gradient is zero exactly where clipping is active.
    objective = jnp.minimum(unclipped, clipped)

    negative = a < 0
    clipped_low = negative & (ratio < 1.0 - eps_low)
    clipped_high = (a > 0) & (ratio > 1.0 + eps_high)
    if dual_clip is None:
        dual_clipped = jnp.zeros_like(clipped_low)
    else:
        bound = dual_clip * a
        dual_clipped = negative & (bound > objective)
        objective = jnp.where(dual_clipped, bound, objective)

    loss = -objective
    as_float = lambda b: b.astype(ratio.dtype)  # noqa: E731 - local helper
    aux = PolicyLossAux(
        ratio=ratio,
        clipped_low=as_float(clipped_low),
        clipped_high=as_float(clipped_high),
        dual_clipped=as_float(dual_clipped),
    )
    return loss, aux
