"""The rollout correction inside the shared objective, and the metrics that tell mismatch from staleness.

`correct_policy_terms` is what rl_core.train.objective.policy_gradient_loss calls for every
algorithm: it weighs the per-token policy-gradient terms by the correction's weights
(rl_core.math.rollout_correction), drops the tokens outside its keep-mask from the numerator,
and returns the mask the loss aggregates with (the rejection modes, as verl, also drop those
tokens from the denominator; the others keep it).

Metrics, as (sum, count) means and maxima over the micro-batch's real tokens:

rollout/mismatch_*   same-weights mismatch: the engine's log-prob vs the trainer's recomputation
                     under the weights that sampled (synchronous rollouts, where `old_logp` is the
                     behaviour policy's): |old_logp - sampler_logp| token-weighted mean
                     (`_logp_abs_mean`), max (`_logp_abs_max`) and mean over sequences of each
                     sequence's mean (`_seq_logp_abs_mean`). With async rollouts `old_logp` is the
                     proximal policy's, one version newer than the sampler's weights, so the same
                     difference mixes mismatch and staleness: it is logged as rollout/offpolicy_*
                     instead, and no mismatch_* (the trainer does not recompute under the
                     sampler's weights).
rollout/staleness_*  version lag: |logp - old_logp| (the current policy vs the behaviour /
                     proximal one; 0 in value on the first mini-batch of an on-policy step),
                     mean and max; `rollout/staleness_version_lag` (steps between the weights
                     that sampled the batch and the update's) is added by the learner.
rollout/corrected_frac, masked_frac, seq_masked_frac, weight_mean
                     the correction's (rl_core.math.rollout_correction.correction_metrics).
drift/*              the older names, kept: drift/logp_abs_mean and _max (= |old_logp -
                     sampler_logp| whatever old_logp is), drift/tis_weight_mean and
                     drift/tis_capped_frac (token_tis only).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from rl_core.math.rollout_correction import DROPS_FROM_DENOMINATOR, correction_metrics, rollout_correction


def correct_policy_terms(
    pg: jax.Array,  # [B, T] per-token policy-gradient terms
    logp: jax.Array,  # [B, T] current policy
    old_logp: jax.Array,  # [B, T] behaviour / proximal policy (stop_gradient(logp) on an on-policy step)
    sampler_logp: jax.Array | None,  # [B, T] the engine's
    mask: jax.Array,  # [B, T]
    *,
    correction: Any,  # rl_core.correction_config.RolloutCorrection (static)
    proximal: bool = False,  # async rollouts: old_logp is the proximal policy's (static)
) -> tuple[jax.Array, jax.Array, dict[str, tuple[jax.Array, jax.Array]], dict[str, jax.Array]]:
    """(corrected pg [B, T], the mask the loss aggregates with [B, T], means, maxima)."""
    means: dict[str, tuple[jax.Array, jax.Array]] = {}
    maxima: dict[str, jax.Array] = {}
    real = mask > 0
    m = real.astype(jnp.float32)
    tokens = jnp.sum(m)
    old = jax.lax.stop_gradient(old_logp)
    moved = jnp.where(real, jnp.abs(jax.lax.stop_gradient(logp) - old), 0.0)
    means["rollout/staleness_logp_abs_mean"] = (jnp.sum(moved), tokens)
    maxima["rollout/staleness_logp_abs_max"] = jnp.max(moved)
    loss_mask = mask
    on = correction is not None and correction.mode != "off"
    if sampler_logp is None:
        if on:
            raise ValueError(f"rollout correction (mode {correction.mode!r}) needs the sampler's log-probs (sampler_logp)")
        return pg, loss_mask, means, maxima
    gap = jnp.where(real, jnp.abs(old - sampler_logp), 0.0)
    # the older names: the sampler vs the trainer's old_logp, whichever policy that is
    means["drift/logp_abs_mean"] = (jnp.sum(gap), tokens)
    maxima["drift/logp_abs_max"] = jnp.max(gap)
    name = "rollout/offpolicy" if proximal else "rollout/mismatch"
    rows = jnp.sum(m, axis=-1)
    per_row = jnp.sum(gap, axis=-1) / jnp.maximum(rows, 1.0)
    means[f"{name}_logp_abs_mean"] = (jnp.sum(gap), tokens)
    means[f"{name}_seq_logp_abs_mean"] = (jnp.sum(jnp.where(rows > 0, per_row, 0.0)), jnp.sum(rows > 0).astype(jnp.float32))
    maxima[f"{name}_logp_abs_max"] = jnp.max(gap)
    mode = correction.mode if on else "off"
    cap = correction.cap if on else None
    weights, keep = rollout_correction(mode, old, sampler_logp, mask, cap=cap, lower=correction.lower if on else None)
    if on:
        pg = jnp.where(keep, pg * weights, 0.0)
        if mode in DROPS_FROM_DENOMINATOR:
            loss_mask = mask * keep.astype(jnp.asarray(mask).dtype)
    means.update(correction_metrics(mode, weights, keep, mask, cap=cap))
    if mode == "token_tis":
        means["drift/tis_weight_mean"] = (jnp.sum(jnp.where(real, weights, 0.0)), tokens)
        means["drift/tis_capped_frac"] = (jnp.sum((real & (weights >= cap)).astype(jnp.float32)), tokens)
    return pg, loss_mask, means, maxima
