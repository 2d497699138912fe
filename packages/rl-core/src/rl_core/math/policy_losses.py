"""Per-token policy-gradient losses (unreduced; aggregation is separate).

`clipped_surrogate` is PPO's clipped objective (arXiv:1707.06347) with
separate lower and upper clip widths, so one function serves GRPO
(eps_low = eps_high = 0.2, arXiv:2402.03300) and DAPO's clip-higher
(eps_low = 0.2, eps_high = 0.28, arXiv:2503.14476), plus optional dual clip
(arXiv:1912.09729). Per token, with rho_t = exp(logp_t - old_logp_t):

    l_t = -min(rho_t A, clip(rho_t, 1 - eps_low, 1 + eps_high) A)

Every policy loss is called as `fn(logp, old_logp, adv, mask, *, eps_low,
eps_high, dual_clip)` (rl_core.protocols.PolicyLoss) and returns losses per
token [B, T] or per sequence [B] together with diagnostics of the same shape;
the caller aggregates both with the mask (rl_core.math.aggregation, which states
how a per-sequence term is weighed). The log-ratio is zeroed at masked positions before the
exponent and bounded to +-LOG_RATIO_BOUND, so garbage in padding (or a
runaway ratio) can never make the loss or its gradient non-finite.

`truncated_is_weights` is the sampler/trainer mismatch correction every
algorithm may switch on (truncated importance sampling, Yao et al. 2025, "Your
Efficient RL Framework Secretly Brings You Off-Policy RL Training"): the
sampler (e.g. a bfloat16 rollout engine) and the trainer's forward pass give
the same policy slightly different probabilities, so each token's loss is
weighed by min(pi_old_trainer / pi_sampler, C).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from rl_core.protocols import PolicyLossAux
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


def token_advantages(adv: jax.Array, logp: jax.Array) -> jax.Array:
    """Advantages as [B, T]: one per completion [B] is shared by its tokens; [B, T] is kept."""
    adv = jnp.asarray(adv)
    b = jnp.shape(logp)[0]
    if jnp.shape(adv) == (b,):
        return adv[:, None]
    if jnp.shape(adv) == jnp.shape(logp):
        return adv
    raise ValueError(f"adv must be [B] or [B, T] with [B, T] = {jnp.shape(logp)}, got shape {jnp.shape(adv)}")


def truncated_is_weights(old_logp: jax.Array, sampler_logp: jax.Array, mask: jax.Array, *, cap: float) -> jax.Array:
    """min(exp(old_logp - sampler_logp), cap) per token [B, T], without gradient; 1 at masked positions.

    old_logp: the trainer's log-probs of the behaviour policy; sampler_logp: what the
    sampler reported for the same tokens. Truncating at `cap` (C) bounds the variance
    that a token the sampler under-rates would add (Yao et al. 2025).
    """
    if isinstance(cap, (int, float)) and not cap >= 1.0:
        raise ValueError(f"the truncation cap C must be >= 1 (a weight of 1 means no mismatch), got {cap}")
    weights = jnp.minimum(jnp.exp(log_ratio(old_logp, sampler_logp, mask)), cap)
    return jax.lax.stop_gradient(weights)


def _check_scalars(eps_low: float, eps_high: float, dual_clip: float | None) -> None:
    """Validate the clip widths when they are concrete Python numbers."""
    if isinstance(eps_low, (int, float)) and not 0.0 <= eps_low <= 1.0:
        raise ValueError(f"eps_low must be in [0, 1] (1 = no lower bound, as ratios are > 0), got {eps_low}")
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

    logp, old_logp: float [B, T]; adv: float [B] (one advantage per completion,
    shared by its tokens) or [B, T] (per token); mask: float [B, T], 1 = token in the loss.
    Returns (loss float [B, T], PolicyLossAux). With `dual_clip` = c > 1, tokens
    with A < 0 use max(min(rho A, clip(rho) A), c A): a very large ratio on a bad
    action cannot produce an unbounded loss.
    """
    _check_scalars(eps_low, eps_high, dual_clip)
    if jnp.shape(logp) != jnp.shape(old_logp):
        raise ValueError(f"logp {jnp.shape(logp)} and old_logp {jnp.shape(old_logp)} must have the same shape [B, T]")
    if jnp.shape(mask) != jnp.shape(logp):
        raise ValueError(f"mask {jnp.shape(mask)} must have the shape of logp {jnp.shape(logp)}")
    ratio = jnp.exp(log_ratio(logp, old_logp, mask))
    a = token_advantages(adv, logp).astype(ratio.dtype)
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
