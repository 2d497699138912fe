"""GSPO: the sequence ratio, its per-sequence clip and the GSPO-token form, by hand."""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from algo_grpo import GRPOConfig
from algo_gspo import GSPOConfig, gspo_loss, gspo_token_loss, sequence_log_ratio
from rl_core import registry
from rl_core.math.aggregation import aggregate, per_token
from tolerances import close

VARIANTS = pytest.mark.parametrize("variant", [lambda f: f, jax.jit], ids=["eager", "jit"])
PAPER = dict(eps_low=3e-4, eps_high=4e-4)
MODES = ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]

# Five completions, T = 3. logp - old_logp per real token, and the sequence log-ratio (their mean):
#   row 0: [0.3, -0.1, 0.1]  -> 0.1   s = e^0.1  = 1.1051709, A = +1  -> clipped high: -(1 + 4e-4)
#   row 1: [-0.2, 0.0, pad]  -> -0.1  s = e^-0.1 = 0.9048374, A = +2  -> unclipped: -2 s = -1.8096748
#   row 2: fully masked      -> 0     s = 1,                  A = +5  -> -5, but weighs nothing
#   row 3: [0.2, pad, pad]   -> 0.2   s = e^0.2  = 1.2214028, A = -1  -> unclipped: +s  = 1.2214028
#   row 4: [-0.3, -0.3, pad] -> -0.3  s = e^-0.3 = 0.7408182, A = -1  -> clipped low: -(1 - 3e-4) * -1 = 0.9997
OLD = jnp.asarray([[-1.0, -2.0, -0.5], [-1.0, -1.0, -1.0], [-1.0, -1.0, -1.0], [-2.0, -1.0, -1.0], [-1.0, -1.0, -1.0]])
DIFF = jnp.asarray([[0.3, -0.1, 0.1], [-0.2, 0.0, 9.0], [7.0, 7.0, 7.0], [0.2, 9.0, 9.0], [-0.3, -0.3, 9.0]])
LOGP = OLD + DIFF  # garbage (9, 7) where masked
MASK = jnp.asarray([[1.0, 1, 1], [1, 1, 0], [0, 0, 0], [1, 0, 0], [1, 1, 0]])
ADV = jnp.asarray([1.0, 2.0, 5.0, -1.0, -1.0])
S = np.exp([0.1, -0.1, 0.0, 0.2, -0.3])
EXPECTED_LOSS = [-(1 + 4e-4), -2 * S[1], -5.0, S[3], 1 - 3e-4]


@VARIANTS
def test_sequence_log_ratio_is_the_mean_over_real_tokens(variant):
    np.testing.assert_allclose(variant(sequence_log_ratio)(LOGP, OLD, MASK), [0.1, -0.1, 0.0, 0.2, -0.3],
        **close(atol=1e-6))


@VARIANTS
def test_per_sequence_loss_and_clip_by_hand(variant):
    loss, aux = variant(functools.partial(gspo_loss, **PAPER, dual_clip=None))(LOGP, OLD, ADV, MASK)
    assert loss.shape == aux.ratio.shape == (5,)  # one term per sequence
    np.testing.assert_allclose(loss, EXPECTED_LOSS, **close(atol=1e-5))
    np.testing.assert_allclose(aux.ratio, S, **close(atol=1e-5))
    np.testing.assert_array_equal(aux.clipped_high, [1, 0, 0, 0, 0])
    np.testing.assert_array_equal(aux.clipped_low, [0, 0, 0, 0, 1])


@VARIANTS
def test_averaged_over_sequences_and_gradient_by_hand(variant):
    def mean_loss(logp):
        total, denom = aggregate("seq-mean-token-mean", gspo_loss(logp, OLD, ADV, MASK, **PAPER)[0], MASK, max_len=3)
        return total / denom

    value, grad = variant(jax.value_and_grad(mean_loss))(LOGP)
    # Four non-empty sequences (row 2 has no token): (-1.0004 - 1.8096748 + 1.2214028 + 0.9997) / 4
    np.testing.assert_allclose(value, (EXPECTED_LOSS[0] + EXPECTED_LOSS[1] + S[3] + 0.9997) / 4, **close(atol=1e-5))
    # d/dlogp_t of -s A for an unclipped sequence is -A s / |y| on each real token, then / 4 sequences.
    # Rows 0 and 4 are clipped (constant): no gradient. Row 2 and padding: none either.
    expected = np.zeros((5, 3))
    expected[1, :2] = -2 * S[1] / 2 / 4  # -0.2262094
    expected[3, 0] = 1 * S[3] / 1 / 4  # +0.3053507 (A = -1: pushing this token down lowers the loss)
    np.testing.assert_allclose(grad, expected, **close(atol=1e-6))


@VARIANTS
def test_on_policy_ratio_is_exactly_one_and_the_gradient_is_reinforce(variant):
    # old_logp = stop_gradient(logp): s = 1 exactly, loss -A, gradient -A / |y| per token.
    def loss_of(logp):
        return gspo_loss(logp, jax.lax.stop_gradient(logp), ADV, MASK, **PAPER)[0]

    loss = variant(loss_of)(LOGP)
    np.testing.assert_array_equal(loss, -np.asarray(ADV))
    grad = variant(jax.grad(lambda lp: jnp.sum(loss_of(lp))))(LOGP)
    lengths = np.maximum(np.asarray(MASK).sum(1), 1)
    np.testing.assert_allclose(grad, -np.asarray(ADV)[:, None] * np.asarray(MASK) / lengths[:, None],
        **close(atol=1e-6))


def test_a_tied_group_contributes_nothing():
    # GRPO advantages of a tied group are exactly 0, so the loss and its gradient are 0 whatever s is.
    zero = jnp.zeros(5)
    loss, _ = gspo_loss(LOGP, OLD, zero, MASK, **PAPER)
    assert np.array_equal(np.asarray(loss), np.zeros(5))
    grad = jax.grad(lambda lp: jnp.sum(gspo_loss(lp, OLD, zero, MASK, **PAPER)[0]))(LOGP)
    assert np.array_equal(np.asarray(grad), np.zeros((5, 3)))


@pytest.mark.parametrize("mode", MODES)
def test_gspo_token_equals_gspo_in_value_in_every_mode(mode):
    seq, seq_aux = gspo_loss(LOGP, OLD, ADV, MASK, **PAPER)
    tok, tok_aux = gspo_token_loss(LOGP, OLD, ADV, MASK, **PAPER)
    assert tok.shape == (5, 3)
    np.testing.assert_allclose(aggregate(mode, tok, MASK, max_len=3), aggregate(mode, seq, MASK, max_len=3),
        **close(atol=1e-5))
    real = np.asarray(MASK) > 0
    for a, b in zip(seq_aux, tok_aux):  # the same clip decisions, spread over the tokens
        np.testing.assert_allclose(np.asarray(per_token(a, MASK))[real], np.asarray(b)[real], **close(atol=1e-5))


@VARIANTS
def test_gspo_token_gradient_equals_gspo_under_the_sequence_mean(variant):
    def mean(fn):
        return lambda lp: jnp.divide(*aggregate("seq-mean-token-mean", fn(lp, OLD, ADV, MASK, **PAPER)[0], MASK, max_len=3))

    np.testing.assert_allclose(variant(jax.grad(mean(gspo_token_loss)))(LOGP), jax.grad(mean(gspo_loss))(LOGP),
        **close(atol=1e-6))


def test_gspo_token_takes_per_token_advantages():
    # Unclipped (eps large): token loss -s_i A_it with s_i detached, so d/dlogp_t = -s_i A_it on real tokens.
    adv = jnp.asarray([[1.0, -1.0, 2.0], [0.5, 3.0, 0.0], [1.0, 1.0, 1.0], [-2.0, 0.0, 0.0], [1.0, 0.0, 0.0]])
    grad = jax.grad(lambda lp: jnp.sum(gspo_token_loss(lp, OLD, adv, MASK, eps_low=0.9, eps_high=9.0)[0]))(LOGP)
    np.testing.assert_allclose(grad, -S[:, None] * np.asarray(adv) * np.asarray(MASK), **close(atol=1e-5))


def test_config_defaults_and_registration():
    cfg = GSPOConfig()
    assert (cfg.policy_loss, cfg.epsilon_low, cfg.epsilon_high, cfg.beta) == ("gspo", 3e-4, 4e-4, 0.0)
    assert (cfg.advantage_estimator, cfg.loss_agg_mode) == (GRPOConfig().advantage_estimator, "seq-mean-token-mean")
    assert registry.get("policy_loss", "gspo") is gspo_loss
    assert registry.get("policy_loss", "gspo_token") is gspo_token_loss
    assert registry.registry.provider("policy_loss", "gspo") == "algo-gspo"
    assert math.isclose(GSPOConfig(policy_loss="gspo_token").epsilon_high, 4e-4)


@VARIANTS
def test_on_policy_it_is_grpos_update(variant):
    # s_i = 1 and rho_t = 1: GSPO's -A (1/|y|) sum_t grad log pi_t is GRPO's clipped surrogate
    # averaged per sequence, so under "seq-mean-token-mean" value and gradient coincide. Its clip
    # only acts off-policy (several mini-batches or iterations).
    clip = registry.get("policy_loss", "grpo")

    def mean(fn, **eps):
        def loss(lp):
            pg = fn(lp, jax.lax.stop_gradient(lp), ADV, MASK, dual_clip=None, **eps)[0]
            return jnp.divide(*aggregate("seq-mean-token-mean", pg, MASK, max_len=3))

        return variant(jax.value_and_grad(loss))(LOGP)

    (v_gspo, g_gspo), (v_grpo, g_grpo) = mean(gspo_loss, **PAPER), mean(clip, eps_low=0.2, eps_high=0.2)
    # rows 0, 1, 3, 4 are non-empty: -(1 + 2 - 1 - 1) / 4 = -0.25
    np.testing.assert_allclose([v_gspo, v_grpo], [-0.25, -0.25], **close(atol=1e-6))
    np.testing.assert_allclose(g_gspo, g_grpo, **close(rtol=1e-6, atol=1e-7))
