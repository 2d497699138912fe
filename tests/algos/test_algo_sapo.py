"""SAPO: the soft gate (4 / tau) sigmoid(tau (r - 1)) by hand, and against verl's formula.

Reference: verl-project/verl, verl/trainer/ppo/core_algos.py, `compute_policy_loss_sapo`
(arXiv:2511.20347), transcribed literally into numpy below.
"""

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from algo_sapo import ALGORITHM, SAPOConfig, SAPOLearner, sapo_loss
from rl_core import registry
from rl_core.config import ConfigError, RolloutConfig
from rl_core.math.aggregation import aggregate
from rl_core.math.policy_losses import clipped_surrogate
from rl_core.train.behaviour import LogprobPasses
from tolerances import approx, close

VARIANTS = pytest.mark.parametrize("variant", [lambda f: f, jax.jit], ids=["eager", "jit"])
PAPER = dict(eps_low=0.2, eps_high=0.2, dual_clip=None)  # eps_* are not used by SAPO
LN3, LN2 = math.log(3.0), math.log(2.0)
R_LOW = 1 - LN2 / 1.05  # 0.339860: tau_neg (r - 1) = -ln 2, so sigmoid = 1/3

# Three completions, T = 2, tau_pos = 1, tau_neg = 1.05; s = sigmoid(tau (r - 1)),
# loss -(4/tau) s A, d loss / d logp = -4 s (1 - s) r A (d r / d logp = r):
#   row 0, A = 2 (tau = 1):
#     r = 1:        s = 1/2, loss -(4)(1/2)(2) = -4;   grad -4 (1/4)(1)(2) = -2
#     r = 1 + ln 3: s = 3/4, loss -(4)(3/4)(2) = -6;   grad -4 (3/16)(1 + ln 3)(2) = -1.5 (1 + ln 3) = -3.147918
#   row 1, A = -1 (tau = 1.05):
#     r = 1:        s = 1/2, loss (4/1.05)(1/2) = 1.904762;  grad -4 (1/4)(1)(-1) = +1
#     r = 0.339860: s = 1/3, loss (4/1.05)(1/3) = 1.269841;  grad -4 (2/9)(0.339860)(-1) = +0.302098
#   row 2: fully masked (garbage logp): no gradient
OLD = jnp.asarray([[-1.0, -1.0], [-2.0, -2.0], [-1.0, -1.0]])
LOGP = jnp.asarray([[-1.0, -1.0 + math.log(1 + LN3)], [-2.0, -2.0 + math.log(R_LOW)], [jnp.nan, jnp.inf]])
MASK = jnp.asarray([[1.0, 1.0], [1.0, 1.0], [0.0, 0.0]])
ADV = jnp.asarray([2.0, -1.0, 5.0])
HAND_LOSS = [[-4.0, -6.0], [1.904762, 1.269841]]
HAND_GRAD = [[-2.0, -1.5 * (1 + LN3)], [1.0, 8 / 9 * R_LOW], [0.0, 0.0]]


@VARIANTS
def test_gate_values_and_diagnostics_by_hand(variant):
    loss, aux = variant(functools.partial(sapo_loss, **PAPER))(LOGP, OLD, ADV, MASK)
    np.testing.assert_allclose(np.asarray(loss)[:2], HAND_LOSS, **close(atol=1e-5))
    np.testing.assert_allclose(aux.ratio[:2], [[1.0, 1 + LN3], [1.0, R_LOW]], **close(rtol=1e-6))
    # the gradient share the gate removes, 1 - 4 s (1 - s): 1 - 3/4 = 1/4 (A > 0, r > 1), 1 - 8/9 = 1/9 (A < 0, r < 1)
    np.testing.assert_allclose(aux.clipped_high, [[0, 0.25], [0, 0], [0, 0]], **close(atol=1e-6))
    np.testing.assert_allclose(aux.clipped_low, [[0, 0], [0, 1 / 9], [0, 0]], **close(atol=1e-6))
    np.testing.assert_array_equal(aux.dual_clipped, np.zeros((3, 2)))


@VARIANTS
def test_gradients_by_hand(variant):
    grad = variant(jax.grad(lambda lp: jnp.sum(sapo_loss(lp, OLD, ADV, MASK, **PAPER)[0] * MASK)))(LOGP)
    np.testing.assert_allclose(grad, HAND_GRAD, **close(atol=1e-5))


def test_seq_mean_token_mean_value_and_gradient():
    def mean_loss(logp):
        total, denom = aggregate("seq-mean-token-mean", sapo_loss(logp, OLD, ADV, MASK, **PAPER)[0], MASK, max_len=2)
        return total / denom

    value, grad = jax.value_and_grad(mean_loss)(LOGP)
    # rows 0 and 1 (row 2 has no tokens): ((-4 - 6) / 2 + (1.904762 + 1.269841) / 2) / 2 = (-5 + 1.587302) / 2
    assert float(value) == approx((-5.0 + 1.5873016) / 2, abs=1e-5)
    # each token's gradient / (2 tokens) / (2 sequences)
    np.testing.assert_allclose(grad, np.asarray(HAND_GRAD) / 4, **close(atol=1e-5))


def test_at_ratio_one_the_gradient_is_the_unclipped_policy_gradient():
    # 4 s (1 - s) r = 4 (1/2)(1/2)(1) = 1 whatever tau: d loss / d logp = -A, as GRPO's on-policy step
    logp = jnp.log(jnp.asarray([[0.3, 0.6]]))
    adv = jnp.asarray([0.7])
    one = jnp.ones((1, 2))
    for taus in [(1.0, 1.05), (0.5, 3.0)]:
        g = jax.grad(lambda lp: jnp.sum(sapo_loss(lp, logp, adv, one, **PAPER, tau_pos=taus[0], tau_neg=taus[1])[0]))
        np.testing.assert_allclose(g(logp), [[-0.7, -0.7]], **close(atol=1e-6))
    g_clip = jax.grad(lambda lp: jnp.sum(clipped_surrogate(lp, logp, adv, one, **PAPER)[0]))(logp)
    np.testing.assert_allclose(g_clip, [[-0.7, -0.7]], **close(atol=1e-6))


def test_far_off_policy_tokens_keep_a_small_gradient_where_the_clip_cuts_it():
    # r = 1.5, A = 1, tau = 1: s = sigmoid(0.5) = 0.622459, s (1 - s) = 0.235004,
    # grad -4 (0.235004)(1.5) = -1.410022; GRPO's clip at 1.2 gives 0
    # the logs taken on the host: a TPU's float32 log is 6e-5 off at 1.5, which the gradient would carry
    old = jnp.full((1, 1), np.log(0.4), jnp.float32)
    logp = old + np.float32(np.log(1.5))
    one, adv = jnp.ones((1, 1)), jnp.asarray([1.0])
    s = 1 / (1 + math.exp(-0.5))
    g = jax.grad(lambda lp: sapo_loss(lp, old, adv, one, **PAPER)[0][0, 0])(logp)
    assert float(g[0, 0]) == approx(-4 * s * (1 - s) * 1.5, abs=1e-6) == approx(-1.410022, abs=1e-6)
    g_clip = jax.grad(lambda lp: clipped_surrogate(lp, old, adv, one, **PAPER)[0][0, 0])(logp)
    assert float(g_clip[0, 0]) == 0.0


# -- against verl's formula ------------------------------------------------------------------


def verl_sapo(old_log_prob, log_prob, advantages, response_mask, tau_pos, tau_neg):
    """numpy transcription of verl's compute_policy_loss_sapo (float64), before agg_loss, and
    its "seq-mean-token-mean" aggregation; advantages [B, T] as verl passes them."""

    def sigmoid(x):
        return 1.0 / (1.0 + np.exp(-x))

    def gate_function(x, tau):
        return sigmoid(tau * (x - 1.0)) * (4.0 / tau)

    negative_approx_kl = log_prob - old_log_prob
    negative_approx_kl = np.clip(negative_approx_kl, -20.0, 20.0)
    ratio = np.exp(negative_approx_kl)
    taus = np.where(advantages > 0, tau_pos, tau_neg)
    gates = gate_function(ratio, taus)
    pg_losses = -gates * advantages
    seq_losses = np.sum(pg_losses * response_mask, axis=-1) / np.sum(response_mask, axis=-1)
    return pg_losses, np.mean(seq_losses)


@pytest.mark.parametrize("taus", [(1.0, 1.05), (0.3, 2.0)])
def test_matches_verl_on_random_inputs(taus):
    rng = np.random.default_rng(0)
    b, t = 6, 9
    old = np.log(rng.uniform(0.01, 1.0, (b, t))).astype(np.float32)
    logp = (old + rng.normal(0.0, 0.4, (b, t))).clip(max=0.0).astype(np.float32)
    adv = rng.normal(0.0, 1.0, b).astype(np.float32)
    lengths = rng.integers(1, t + 1, b)
    mask = (np.arange(t)[None, :] < lengths[:, None]).astype(np.float32)
    ref_tokens, ref_value = verl_sapo(
        old.astype(np.float64), logp.astype(np.float64), np.broadcast_to(adv[:, None], (b, t)).astype(np.float64),
        mask, *taus,
    )  # fmt: skip
    fn = functools.partial(sapo_loss, **PAPER, tau_pos=taus[0], tau_neg=taus[1])
    loss, _ = jax.jit(fn)(jnp.asarray(logp), jnp.asarray(old), jnp.asarray(adv), jnp.asarray(mask))
    real = mask > 0
    np.testing.assert_allclose(np.asarray(loss)[real], ref_tokens[real], **close(rtol=1e-6, atol=1e-6))
    total, denom = aggregate("seq-mean-token-mean", loss, jnp.asarray(mask), max_len=t)
    assert float(total / denom) == approx(ref_value, rel=1e-6, abs=1e-6)
    # and per-token [B, T] advantages (verl's own input shape) give the same
    loss_bt, _ = fn(jnp.asarray(logp), jnp.asarray(old), jnp.broadcast_to(jnp.asarray(adv)[:, None], (b, t)), mask)
    np.testing.assert_allclose(np.asarray(loss_bt)[real], ref_tokens[real], **close(rtol=1e-6, atol=1e-6))
    # the gradient torch's autograd takes through verl's formula: -A (4/tau) s (1 - s) tau r = -4 s (1 - s) r A
    ratio = np.exp(logp.astype(np.float64) - old)
    tau = np.where(adv[:, None] > 0, taus[0], taus[1])
    s = 1 / (1 + np.exp(-tau * (ratio - 1)))
    ref_grad = -4 * s * (1 - s) * ratio * adv[:, None] * mask
    grad = jax.grad(lambda lp: jnp.sum(fn(lp, jnp.asarray(old), jnp.asarray(adv), jnp.asarray(mask))[0] * mask))(
        jnp.asarray(logp)
    )
    np.testing.assert_allclose(grad, ref_grad, **close(rtol=1e-5, atol=1e-6))


# -- config, learner, registration ------------------------------------------------------------


def test_config_defaults_and_registration():
    cfg = SAPOConfig()
    assert (cfg.policy_loss, cfg.tau_pos, cfg.tau_neg, cfg.beta) == ("sapo", 1.0, 1.05, 0.0)
    assert (cfg.loss_agg_mode, cfg.advantage_estimator) == ("seq-mean-token-mean", "grpo")
    assert registry.get("policy_loss", "sapo") is sapo_loss
    assert registry.registry.provider("policy_loss", "sapo") == "algo-sapo"
    assert registry.get_algorithm("sapo") is ALGORITHM
    assert SAPOConfig.from_dict(SAPOConfig(tau_neg=2.0).to_dict()) == SAPOConfig(tau_neg=2.0)


@pytest.mark.parametrize("field", ["tau_pos", "tau_neg"])
def test_temperatures_must_be_positive(field):
    with pytest.raises(ConfigError, match=f"SAPOConfig.{field} = 0.0: must be > 0"):
        SAPOConfig(**{field: 0.0})


def test_dual_clip_is_rejected():
    with pytest.raises(ValueError, match="no dual clip"):
        sapo_loss(LOGP, OLD, ADV, MASK, eps_low=0.2, eps_high=0.2, dual_clip=3.0)
    with pytest.raises(ConfigError, match="SAPOConfig.dual_clip = 3.0"):
        SAPOConfig(dual_clip=3.0)


def test_the_learner_binds_the_configured_temperatures():
    """SAPOLearner.loss_of, what the learner trains and trainer plan compiles, gates at the config's
    temperatures; another configured policy loss is left as the config names it."""
    config = SAPOConfig(tau_pos=0.5, tau_neg=3.0)
    passes = LogprobPasses.of(config, num_mini_batches=1, async_rollout="off")
    bound = SAPOLearner.loss_of(config, RolloutConfig(), passes).keywords["policy_loss"]
    assert (bound.func, bound.keywords) == (sapo_loss, {"tau_pos": 0.5, "tau_neg": 3.0})
    other = SAPOLearner.loss_of(dataclasses.replace(config, policy_loss="grpo"), RolloutConfig(), passes)
    assert other.keywords["policy_loss"] is registry.get("policy_loss", "grpo")
