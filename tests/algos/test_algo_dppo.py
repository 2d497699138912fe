"""DPPO: the binary-TV and binary-KL trust-region masks by hand, and against verl's formulas.

Reference: verl-project/verl, verl/trainer/ppo/core_algos.py, `compute_policy_loss_dppo_tv`
and `compute_policy_loss_dppo_kl` (arXiv:2602.04879), transcribed literally into numpy below.
"""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from algo_dppo import ALGORITHM, DPPOConfig, dppo_kl_loss, dppo_tv_loss
from rl_core import registry
from rl_core.math.aggregation import aggregate
from rl_core.math.policy_losses import clipped_surrogate
from tolerances import approx, close

VARIANTS = pytest.mark.parametrize("variant", [lambda f: f, jax.jit], ids=["eager", "jit"])
TV = dict(eps_low=0.15, eps_high=0.15)
KL = dict(eps_low=0.05, eps_high=0.05)
LOSSES = pytest.mark.parametrize("loss_fn, delta", [(dppo_tv_loss, TV), (dppo_kl_loss, KL)], ids=["tv", "kl"])

# Three completions, T = 3, as probabilities q = pi_old(y_t) -> p = pi_theta(y_t); r = p / q.
#   row 0, A = +1:
#     q .5 -> p .6, r 1.2: TV p - q = .1 <= .15 in;  KL .5 ln(.5/.6) + .5 ln(.5/.4) = .020411 <= .05 in
#                          loss -A r ln p = -1.2 ln .6 = 0.612991, grad -A r = -1.2
#     q .5 -> p .7, r 1.4: TV .2 > .15 out;          KL .5 ln(.5/.7) + .5 ln(.5/.3) = .087177 > .05 out
#                          loss 0, grad 0, clipped_high
#     q .01 -> p .05, r 5: TV .04 in;                KL .01 ln(.2) + .99 ln(.99/.95) = .024735 in
#                          loss -5 ln .05 = 14.978661, grad -5 (PPO's clip at 1.2 gives this rare token 0)
#   row 1, A = -2:
#     q .5 -> p .3, r .6:  TV -.2 < -.15 out;        KL .087177 > .05 and p < q: out. loss 0, clipped_low
#     q .4 -> p .3, r .75: TV -.1 in;                KL .4 ln(4/3) + .6 ln(.6/.7) = .022582 in
#                          loss -(-2)(.75) ln .3 = -1.805959, grad +2 (.75) = 1.5
#     masked (garbage): loss 0, grad 0
#   row 2: fully masked garbage
Q = np.asarray([[0.5, 0.5, 0.01], [0.5, 0.4, 0.3], [0.2, 0.2, 0.2]])
P = np.asarray([[0.6, 0.7, 0.05], [0.3, 0.3, 0.3], [0.2, 0.2, 0.2]])
OLD = jnp.asarray(np.log(Q), jnp.float32)
LOGP = jnp.asarray(np.log(P), jnp.float32).at[1, 2].set(jnp.nan).at[2].set(jnp.asarray([jnp.inf, jnp.nan, 3.0]))
MASK = jnp.asarray([[1.0, 1, 1], [1, 1, 0], [0, 0, 0]])
ADV = jnp.asarray([1.0, -2.0, 7.0])
HAND_LOSS = [[0.612991, 0.0, 14.978661], [0.0, -1.805959, 0.0], [0.0, 0.0, 0.0]]
HAND_GRAD = [[-1.2, 0.0, -5.0], [0.0, 1.5, 0.0], [0.0, 0.0, 0.0]]


@VARIANTS
@LOSSES
def test_loss_masks_and_flags_by_hand(variant, loss_fn, delta):
    loss, aux = variant(functools.partial(loss_fn, **delta, dual_clip=None))(LOGP, OLD, ADV, MASK)
    np.testing.assert_allclose(loss, HAND_LOSS, **close(atol=1e-5))
    np.testing.assert_allclose(np.asarray(aux.ratio)[:2, :2], [[1.2, 1.4], [0.6, 0.75]], **close(rtol=1e-5))
    np.testing.assert_array_equal(aux.clipped_high, [[0, 1, 0], [0, 0, 0], [0, 0, 0]])
    np.testing.assert_array_equal(aux.clipped_low, [[0, 0, 0], [1, 0, 0], [0, 0, 0]])
    np.testing.assert_array_equal(aux.dual_clipped, np.zeros((3, 3)))


@VARIANTS
@LOSSES
def test_gradients_by_hand(variant, loss_fn, delta):
    grad = variant(jax.grad(lambda lp: jnp.sum(loss_fn(lp, OLD, ADV, MASK, **delta)[0])))(LOGP)
    np.testing.assert_allclose(grad, HAND_GRAD, **close(atol=1e-5))
    assert np.all(np.isfinite(grad))


def test_token_mean_value_and_gradient():
    def mean_loss(logp):
        total, denom = aggregate("token-mean", dppo_tv_loss(logp, OLD, ADV, MASK, **TV)[0], MASK, max_len=3)
        return total / denom

    value, grad = jax.value_and_grad(mean_loss)(LOGP)
    # (0.612991 + 0 + 14.978661 + 0 - 1.805959) / 5 real tokens = 2.757139
    assert float(value) == approx(13.785693 / 5, abs=1e-5)
    np.testing.assert_allclose(grad, np.asarray(HAND_GRAD) / 5, **close(atol=1e-6))


def test_the_truncation_c_is_the_dual_clip_field():
    # C = 3: the rare token's weight min(5, 3) = 3: loss -3 ln .05 = 8.987197, grad -3, flagged
    loss, aux = dppo_tv_loss(LOGP, OLD, ADV, MASK, **TV, dual_clip=3.0)
    assert float(loss[0, 2]) == approx(8.987197, abs=1e-5)
    np.testing.assert_array_equal(aux.dual_clipped, [[0, 0, 1], [0, 0, 0], [0, 0, 0]])
    grad = jax.grad(lambda lp: jnp.sum(dppo_tv_loss(lp, OLD, ADV, MASK, **TV, dual_clip=3.0)[0]))(LOGP)
    np.testing.assert_allclose(grad[0], [-1.2, 0.0, -3.0], **close(atol=1e-5))


def test_a_rare_token_inside_the_divergence_region_keeps_the_gradient_the_ratio_clip_cuts():
    # row 0 token 2 (q .01 -> p .05, r = 5, A = 1): PPO/GRPO's clip at 1.2 makes its gradient exactly 0
    def token(fn, **kw):
        return float(jax.grad(lambda lp: fn(lp, OLD, ADV, MASK, **kw)[0][0, 2])(LOGP)[0, 2])

    assert token(clipped_surrogate, eps_low=0.2, eps_high=0.2, dual_clip=None) == 0.0
    assert token(dppo_tv_loss, **TV) == approx(-5.0, abs=1e-5)


def test_tv_and_kl_disagree_on_a_likely_token():
    # A = 1, q .9 -> p .99: TV .09 <= .15 in; KL .9 ln(.9/.99) + .1 ln(.1/.01) = -.085779 + .230259 = .144479 > .05 out
    old, logp = jnp.log(jnp.asarray([[0.9]])), jnp.log(jnp.asarray([[0.99]]))
    one, adv = jnp.ones((1, 1)), jnp.asarray([1.0])
    assert float(dppo_tv_loss(logp, old, adv, one, **TV)[1].clipped_high[0, 0]) == 0.0
    assert float(dppo_kl_loss(logp, old, adv, one, **KL)[1].clipped_high[0, 0]) == 1.0
    # moved against the advantage's push (A > 0, p .1 < q .5): KL = .5 ln 5 + .5 ln(.5/.9) = .510826 but kept
    old, logp = jnp.log(jnp.asarray([[0.5]])), jnp.log(jnp.asarray([[0.1]]))
    assert float(dppo_kl_loss(logp, old, adv, one, **KL)[1].clipped_high[0, 0]) == 0.0


def test_a_tied_group_contributes_nothing():
    loss, _ = dppo_tv_loss(LOGP, OLD, jnp.zeros(3), MASK, **TV)
    assert np.array_equal(np.asarray(loss), np.zeros((3, 3)))


# -- against verl's formulas -----------------------------------------------------------------


def verl_dppo(old_log_prob, log_prob, advantages, clip_divergence_low, clip_divergence_high, clip_ratio_c, kind):
    """numpy transcription (float64) of verl's compute_policy_loss_dppo_tv / _dppo_kl, before
    agg_loss; advantages [B, T] as verl passes them. Returns (pg_losses, the gradient torch's
    autograd takes through them w.r.t. log_prob (truncated_ratio and valid_mask are detached))."""
    negative_approx_kl = log_prob - old_log_prob
    negative_approx_kl = np.clip(negative_approx_kl, -20.0, 20.0)
    ratio = np.exp(negative_approx_kl)
    truncated_ratio = np.minimum(ratio, clip_ratio_c)  # torch.clamp(ratio, max=clip_ratio_c), detached
    prob = np.exp(log_prob)
    old_prob = np.exp(old_log_prob)
    if kind == "tv":
        valid_positive_mask = (prob - old_prob) <= clip_divergence_high
        valid_negative_mask = (prob - old_prob) >= -clip_divergence_low
    else:
        binary_kl = old_prob * (old_log_prob - log_prob) + (1 - old_prob) * np.log(
            (1.0 - old_prob + 1e-8) / (1.0 - prob + 1e-8)
        )
        valid_positive_mask = (binary_kl <= clip_divergence_high) | (prob <= old_prob)
        valid_negative_mask = (binary_kl <= clip_divergence_low) | (prob >= old_prob)
    valid_mask = np.where(advantages > 0, valid_positive_mask, valid_negative_mask).astype(np.float64)
    pg_losses = -advantages * truncated_ratio * log_prob * valid_mask
    return pg_losses, -advantages * truncated_ratio * valid_mask


def random_batch(seed, b=8, t=12):
    rng = np.random.default_rng(seed)
    old = np.log(rng.uniform(0.005, 0.995, (b, t))).astype(np.float32)
    logp = np.log(np.clip(np.exp(old) + rng.normal(0.0, 0.2, (b, t)), 0.002, 0.998)).astype(np.float32)
    adv = rng.normal(0.0, 1.0, b).astype(np.float32)
    lengths = rng.integers(1, t + 1, b)
    mask = (np.arange(t)[None, :] < lengths[:, None]).astype(np.float32)
    return old, logp, adv, mask


@pytest.mark.parametrize("kind, fn, delta", [("tv", dppo_tv_loss, (0.15, 0.2)), ("kl", dppo_kl_loss, (0.05, 0.03))])
@pytest.mark.parametrize("cap", [None, 2.0])
def test_matches_verl_on_random_inputs(kind, fn, delta, cap):
    old, logp, adv, mask = random_batch(1)
    b, t = mask.shape
    adv_bt = np.broadcast_to(adv[:, None], (b, t)).astype(np.float64)
    ref_loss, ref_grad = verl_dppo(old.astype(np.float64), logp.astype(np.float64), adv_bt, *delta,
                                   math.inf if cap is None else cap, kind)  # fmt: skip
    real = mask > 0
    masked_out = (ref_grad == 0) & real & (adv_bt != 0)
    assert 0 < masked_out.sum() < real.sum()  # both sides of the trust region occur
    loss_fn = functools.partial(fn, eps_low=delta[0], eps_high=delta[1], dual_clip=cap)
    args = jnp.asarray(old), jnp.asarray(adv), jnp.asarray(mask)
    loss, aux = jax.jit(loss_fn)(jnp.asarray(logp), *args)
    np.testing.assert_allclose(np.asarray(loss)[real], ref_loss[real], **close(rtol=1e-6, atol=1e-6))
    grad = jax.grad(lambda lp: jnp.sum(loss_fn(lp, *args)[0] * mask))(jnp.asarray(logp))
    np.testing.assert_allclose(np.asarray(grad), ref_grad * mask, **close(rtol=1e-6, atol=1e-6))
    flagged = np.asarray(aux.clipped_low + aux.clipped_high) > 0
    np.testing.assert_array_equal(flagged[real], masked_out[real])
    # the aggregated token-mean too (verl's default loss_agg_mode for DPPO)
    total, denom = aggregate("token-mean", loss, jnp.asarray(mask), max_len=t)
    assert float(total / denom) == approx(np.sum(ref_loss * mask) / np.sum(mask), rel=1e-6, abs=1e-6)


# -- config and registration -------------------------------------------------------------------


def test_config_defaults_and_registration():
    cfg = DPPOConfig()
    assert (cfg.policy_loss, cfg.epsilon_low, cfg.epsilon_high, cfg.dual_clip) == ("dppo_tv", 0.15, 0.15, None)
    assert (cfg.loss_agg_mode, cfg.beta, cfg.advantage_estimator) == ("token-mean", 0.0, "grpo")
    assert registry.get("policy_loss", "dppo_tv") is dppo_tv_loss
    assert registry.get("policy_loss", "dppo_kl") is dppo_kl_loss
    assert registry.registry.provider("policy_loss", "dppo_kl") == "algo-dppo"
    assert registry.get_algorithm("dppo") is ALGORITHM
    kl = DPPOConfig(policy_loss="dppo_kl", epsilon_low=0.05, epsilon_high=0.05)
    assert DPPOConfig.from_dict(kl.to_dict()) == kl
