"""Rollout correction: the sampler/trainer mismatch as importance weights and keep-masks.

The rollout engine (e.g. a bfloat16 sampler) and the trainer's forward pass give the same
policy slightly different probabilities, and with async rollouts the sampler's weights are
also older. Each function here compares, per completion token, the trainer's log-prob of
the behaviour (or proximal) policy `old_logp` with the engine's `sampler_logp`, through the
log-ratio

    log rho_t = old_logp_t - sampler_logp_t        (rho_t = pi_old(y_t) / pi_sampler(y_t))

and returns `(weights, keep)`, both [B, T]:

- `weights` float32, without gradient (IS weights change the measure, not the objective;
  verl rollout_corr_helper detaches them): the loss of token t is `weights_t * l_t`;
- `keep` bool: the real tokens (mask > 0) the correction keeps. A token outside `keep`
  contributes nothing to the loss's numerator. Whether it still counts in the aggregation's
  denominator depends on the mode and follows verl (`DROPS_FROM_DENOMINATOR`): rejection
  modes (verl's `rollout_rs`) modify verl's `response_mask`, so the rejected tokens leave
  the numerator *and* the denominator (and every loss term, the KL term included); masked
  importance sampling (IcePop, verl's `rollout_is_threshold = "lower_upper"`, and TRL's
  `*_mask` modes) only zeroes the weight, so the denominator still counts the token.

Padding (mask == 0) gets weight 1 and keep False; nothing at padding (NaN, inf) reaches an
output. Like verl, every exponent is taken of a log-ratio clamped to +-SAFETY_BOUND (20).

Modes (`MODES`), with verl's names (docs/algo/rollout_corr.md, rollout_corr_math.md and
verl/trainer/ppo/rollout_corr_helper.py of volcengine/verl) and TRL's
(GRPOConfig.vllm_importance_sampling_mode):

    token_tis     w_t = min(rho_t, C)                           verl rollout_is="token"; TRL token_truncate
    seq_is        w_t = min(prod_s rho_s, C)                    verl rollout_is="sequence" (Seq-TIS); TRL sequence_truncate
    token_reject  keep_t = lower <= rho_t <= upper              verl rollout_rs="token" (now token_k1)
    seq_reject    keep_t = lower <= prod_s rho_s <= upper       verl rollout_rs="sequence" (now seq_sum_k1; Seq-MIS)
    geo_reject    keep_t = lower <= exp(mean_s log rho_s) <= upper   verl rollout_rs="geometric" (now seq_mean_k1; Geo-RS)
    icepop        w_t = rho_t * 1[alpha <= rho_t <= beta]       IcePop (Ring-1T, arXiv:2510.18855); verl "0.5_5.0"
    seq_mask      w_t = prod_s rho_s * 1[lower <= prod_s rho_s <= C]   TRL sequence_mask (its default, C = 3)

(the products and means run over the sequence's real tokens).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from rl_core.math.policy_losses import truncated_is_weights

SAFETY_BOUND = 20.0
"""|log rho| (token or sequence level) is clamped here before the exponent, as verl's SAFETY_BOUND."""

MODES = ("off", "token_tis", "seq_is", "token_reject", "seq_reject", "geo_reject", "icepop", "seq_mask")
"""Every rollout-correction mode; "off" weighs every token 1 and keeps every real token."""

DROPS_FROM_DENOMINATOR = frozenset({"token_reject", "seq_reject", "geo_reject"})
"""Modes whose dropped tokens also leave the loss's aggregation denominator (verl's rejection
sampling rewrites response_mask); the others keep the denominator (weight 0, mask unchanged)."""

TRUNCATING = frozenset({"token_tis", "seq_is"})
"""Modes that truncate the weight at `cap` (C) rather than drop tokens."""


def _real(mask: jax.Array) -> jax.Array:
    return jnp.asarray(mask) > 0


def token_log_ratio(old_logp: jax.Array, sampler_logp: jax.Array, mask: jax.Array) -> jax.Array:
    """log rho_t = old_logp - sampler_logp [B, T] float32 without gradient; exactly 0 at padding
    (`jnp.where`, so NaN there never reaches a sum). Not clamped: callers clamp where verl does."""
    old = jax.lax.stop_gradient(jnp.asarray(old_logp, jnp.float32))
    sampler = jax.lax.stop_gradient(jnp.asarray(sampler_logp, jnp.float32))
    return jnp.where(_real(mask), old - sampler, 0.0)


def sequence_log_ratio(old_logp: jax.Array, sampler_logp: jax.Array, mask: jax.Array) -> jax.Array:
    """log prod_t rho_t = sum_t log rho_t over each row's real tokens [B] (verl masked_sum)."""
    return jnp.sum(token_log_ratio(old_logp, sampler_logp, mask), axis=-1)


def geometric_log_ratio(old_logp: jax.Array, sampler_logp: jax.Array, mask: jax.Array) -> jax.Array:
    """mean_t log rho_t over each row's real tokens [B] (verl masked_mean, whose denominator is
    count + 1e-8; here max(count, 1), the same to 1e-8 relative): the log of the geometric-mean
    ratio. 0 for a row without real tokens."""
    count = jnp.sum(_real(mask).astype(jnp.float32), axis=-1)
    return sequence_log_ratio(old_logp, sampler_logp, mask) / jnp.maximum(count, 1.0)


def _ratio(log_ratio: jax.Array) -> jax.Array:
    return jnp.exp(jnp.clip(log_ratio, -SAFETY_BOUND, SAFETY_BOUND))


def _rows(per_row: jax.Array, mask: jax.Array) -> jax.Array:
    """A per-sequence value [B] on every position of its row [B, T]."""
    return jnp.broadcast_to(per_row[:, None], jnp.shape(mask))


def _out(weights: jax.Array, keep: jax.Array, mask: jax.Array) -> tuple[jax.Array, jax.Array]:
    real = _real(mask)
    keep = real & keep
    return jax.lax.stop_gradient(jnp.where(real, weights, 1.0).astype(jnp.float32)), keep


def _check_cap(cap: float, name: str = "cap") -> None:
    if isinstance(cap, (int, float)) and not cap >= 1.0:
        raise ValueError(f"the truncation {name} C must be >= 1 (a weight of 1 means no mismatch), got {cap}")


def _check_band(lower: float, upper: float) -> None:
    if isinstance(lower, (int, float)) and isinstance(upper, (int, float)) and not 0.0 <= lower <= 1.0 <= upper:
        raise ValueError(f"the band [lower, upper] = [{lower}, {upper}] must hold 1 (no mismatch) with lower >= 0")


def token_tis(old_logp: jax.Array, sampler_logp: jax.Array, mask: jax.Array, *, cap: float
              ) -> tuple[jax.Array, jax.Array]:
    """Token-level truncated importance sampling (Yao et al. 2025, "Your Efficient RL Framework
    Secretly Brings You Off-Policy RL Training"; verl rollout_is="token",
    compute_rollout_correction_weights: exp(clamp(log rho, +-20)).clamp(max=threshold)):

        w_t = min(rho_t, C),  keep = every real token (the denominator keeps them all).
    """
    # the formula's one home (the cap's check with it); min(., C) makes verl's upper clamp moot,
    # and its lower one (exp(-20)) differs from exp(log rho) by less than float32 resolves
    weights = truncated_is_weights(old_logp, sampler_logp, mask, cap=cap)
    return _out(weights, jnp.ones_like(weights, bool), mask)


def seq_is(old_logp: jax.Array, sampler_logp: jax.Array, mask: jax.Array, *, cap: float
           ) -> tuple[jax.Array, jax.Array]:
    """Sequence-level truncated importance sampling (Seq-TIS; verl rollout_is="sequence":
    exp(clamp(sum_t log rho_t, +-20)).clamp(max=threshold), broadcast over the row):

        w_t = min(prod_s rho_s, C) for every token t of the row; keep = every real token.

    Unbiased for a sequence-level objective before truncation, at a variance that grows with
    length (verl rollout_corr_math.md section 3.3.2).
    """
    _check_cap(cap)
    w = jnp.minimum(_ratio(sequence_log_ratio(old_logp, sampler_logp, mask)), cap)
    return _out(_rows(w, mask), jnp.ones(jnp.shape(mask), bool), mask)


def token_reject(old_logp: jax.Array, sampler_logp: jax.Array, mask: jax.Array, *, upper: float,
                 lower: float | None = None) -> tuple[jax.Array, jax.Array]:
    """Token-level rejection sampling (verl rollout_rs="token", compute_rollout_rejection_mask:
    mask = (w >= lower) & (w <= upper), lower = 1 / upper when not given; newer verl names it
    token_k1 with "lower_upper" bounds):

        w_t = 1,  keep_t = lower <= rho_t <= upper.

    Rejected tokens leave the loss entirely, denominator included (verl multiplies
    response_mask by the rejection mask): `DROPS_FROM_DENOMINATOR`.
    """
    lower = 1.0 / upper if lower is None else lower
    _check_band(lower, upper)
    rho = _ratio(token_log_ratio(old_logp, sampler_logp, mask))
    return _out(jnp.ones_like(rho), (rho >= lower) & (rho <= upper), mask)


def seq_reject(old_logp: jax.Array, sampler_logp: jax.Array, mask: jax.Array, *, upper: float,
               lower: float | None = None) -> tuple[jax.Array, jax.Array]:
    """Sequence-level rejection sampling (Seq-MIS; verl rollout_rs="sequence", the product of
    the token ratios exp(clamp(sum_t log rho_t, +-20)); newer verl: seq_sum_k1, preset
    decoupled_seq_is_rs with "0.5_2.0"):

        w_t = 1,  keep_t = lower <= prod_s rho_s <= upper  for every token of the row.

    lower = 1 / upper when not given; a rejected row leaves the loss, denominator included.
    """
    lower = 1.0 / upper if lower is None else lower
    _check_band(lower, upper)
    rho = _ratio(sequence_log_ratio(old_logp, sampler_logp, mask))
    keep = (rho >= lower) & (rho <= upper)
    return _out(jnp.ones(jnp.shape(mask), jnp.float32), _rows(keep, mask), mask)


def geo_reject(old_logp: jax.Array, sampler_logp: jax.Array, mask: jax.Array, *, upper: float,
               lower: float | None = None) -> tuple[jax.Array, jax.Array]:
    """Geometric-mean rejection sampling (Geo-RS; verl rollout_rs="geometric":
    exp(clamp(masked_mean(log rho), +-20)); newer verl: seq_mean_k1, preset decoupled_geo_rs
    with bounds 0.999_1.001):

        rho_geo = exp(mean_s log rho_s) = (prod_s rho_s)^(1/|y|),
        w_t = 1,  keep_t = lower <= rho_geo <= upper  for every token of the row.

    Length-normalised, so the bounds sit close to 1 (verl's default upper 1.001). lower =
    1 / upper when not given; a rejected row leaves the loss, denominator included.
    """
    lower = 1.0 / upper if lower is None else lower
    _check_band(lower, upper)
    rho = _ratio(geometric_log_ratio(old_logp, sampler_logp, mask))
    keep = (rho >= lower) & (rho <= upper)
    return _out(jnp.ones(jnp.shape(mask), jnp.float32), _rows(keep, mask), mask)


def icepop(old_logp: jax.Array, sampler_logp: jax.Array, mask: jax.Array, *, lower: float = 0.5,
           upper: float = 5.0) -> tuple[jax.Array, jax.Array]:
    """IcePop's two-sided token masking (Ling Team, "Every Step Evolves: Scaling Reinforcement
    Learning for Trillion-Scale Thinking Model", Ring-1T, arXiv:2510.18855; verl rollout_is="token"
    with rollout_is_threshold="lower_upper", e.g. "0.5_5.0"):

        w_t = M(rho_t; alpha, beta) = rho_t if alpha <= rho_t <= beta else 0,
        keep_t = alpha <= rho_t <= beta.

    The token's gradient is dropped, not clipped. The denominator keeps the dropped tokens
    (IcePop's objective normalises by every response token; verl: "IcePop does not modify
    response_mask; it only changes the IS coefficients"). Defaults alpha = 0.5, beta = 5.
    """
    _check_band(lower, upper)
    rho = _ratio(token_log_ratio(old_logp, sampler_logp, mask))
    inside = (rho >= lower) & (rho <= upper)
    return _out(jnp.where(inside, rho, 0.0), inside, mask)


def seq_mask(old_logp: jax.Array, sampler_logp: jax.Array, mask: jax.Array, *, cap: float,
             lower: float | None = None) -> tuple[jax.Array, jax.Array]:
    """Sequence-level masked importance sampling as TRL's default (GRPOConfig
    vllm_importance_sampling_mode="sequence_mask", vllm_importance_sampling_cap=3.0:
    exp(sum_t log rho_t), then masked_fill(ratio > cap, 0)):

        rho_seq = prod_s rho_s,  w_t = rho_seq * 1[lower <= rho_seq <= C],  keep_t = that indicator.

    `lower` None = no lower bound (TRL's). The weight is the sequence ratio itself, and the
    denominator keeps a masked row (TRL multiplies the per-token loss, the completion mask is
    unchanged). Unlike TRL, the sum is clamped to +-20 before the exponent (verl's bound).
    """
    floor = 0.0 if lower is None else lower
    _check_band(floor, cap)
    rho = _ratio(sequence_log_ratio(old_logp, sampler_logp, mask))
    inside = (rho >= floor) & (rho <= cap)
    return _out(_rows(jnp.where(inside, rho, 0.0), mask), _rows(inside, mask), mask)


def rollout_correction(mode: str, old_logp: jax.Array, sampler_logp: jax.Array, mask: jax.Array, *,
                       cap: float | None = None, lower: float | None = None) -> tuple[jax.Array, jax.Array]:
    """(weights, keep) [B, T] of `mode` (one of MODES) with its thresholds: `cap` is C of the
    truncating modes and the upper bound of the others, `lower` the lower bound where a mode has
    one (None: its default). "off": weights 1, keep every real token."""
    if mode == "off":
        return _out(jnp.ones(jnp.shape(mask), jnp.float32), jnp.ones(jnp.shape(mask), bool), mask)
    if mode not in MODES:
        raise ValueError(f"rollout correction mode {mode!r}: must be one of {MODES}")
    if cap is None and mode != "icepop":
        raise ValueError(f"rollout correction mode {mode!r} needs its cap / upper bound")
    if mode == "token_tis":
        return token_tis(old_logp, sampler_logp, mask, cap=cap)
    if mode == "seq_is":
        return seq_is(old_logp, sampler_logp, mask, cap=cap)
    if mode == "token_reject":
        return token_reject(old_logp, sampler_logp, mask, upper=cap, lower=lower)
    if mode == "seq_reject":
        return seq_reject(old_logp, sampler_logp, mask, upper=cap, lower=lower)
    if mode == "geo_reject":
        return geo_reject(old_logp, sampler_logp, mask, upper=cap, lower=lower)
    if mode == "icepop":
        return icepop(old_logp, sampler_logp, mask, lower=0.5 if lower is None else lower,
                      upper=5.0 if cap is None else cap)
    return seq_mask(old_logp, sampler_logp, mask, cap=cap, lower=lower)


def correction_metrics(mode: str, weights: jax.Array, keep: jax.Array, mask: jax.Array, *,
                       cap: float | None = None) -> dict[str, tuple[jax.Array, jax.Array]]:
    """Token- and sequence-level fractions of a correction, as (sum, count) pairs:

    rollout/weight_mean       mean weight over the real tokens
    rollout/corrected_frac    real tokens whose weight the cap truncated (rho >= C; truncating modes, else 0)
    rollout/masked_frac       real tokens outside `keep` (dropped from the numerator)
    rollout/seq_masked_frac   non-empty rows with at least one dropped token (verl rollout_rs_seq_masked_fraction)
    """
    real = _real(mask)
    m = real.astype(jnp.float32)
    dropped = (real & ~keep).astype(jnp.float32)
    if mode in TRUNCATING and cap is not None:
        corrected = (real & (weights >= cap)).astype(jnp.float32)
    else:
        corrected = jnp.zeros_like(m)
    rows = jnp.any(real, axis=-1).astype(jnp.float32)
    row_dropped = jnp.any(dropped > 0, axis=-1).astype(jnp.float32)
    tokens = jnp.sum(m)
    return {
        "rollout/weight_mean": (jnp.sum(jnp.where(real, weights, 0.0)), tokens),
        "rollout/corrected_frac": (jnp.sum(corrected), tokens),
        "rollout/masked_frac": (jnp.sum(dropped), tokens),
        "rollout/seq_masked_frac": (jnp.sum(row_dropped), jnp.sum(rows)),
    }
