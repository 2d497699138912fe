"""REINFORCE++-baseline: group-centred, batch-normalised advantages and the k2 KL loss term, by hand."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from algo_dr_grpo import dr_grpo_advantages
from algo_reinforce_pp import ReinforcePPConfig, reinforce_pp_advantages
from rl_core import registry
from rl_core.train.objective import policy_gradient_loss
from rl_core.types import TrainExample
from tolerances import close

VARIANTS = pytest.mark.parametrize("variant", [lambda f: f, jax.jit], ids=["eager", "jit"])


def _adv(variant, rewards, group_size):
    return np.asarray(variant(lambda r: reinforce_pp_advantages(r, group_size))(jnp.asarray(rewards, jnp.float32)))


@VARIANTS
def test_three_groups_of_two_by_hand(variant):
    # Centred within groups: [1, 0] -> [0.5, -0.5]; [1, 1] (tied) -> [0, 0]; [0.5, 0] -> [0.25, -0.25].
    # Batch mean 0; batch std (over all six) = sqrt((0.25 + 0.25 + 0 + 0 + 0.0625 + 0.0625) / 6)
    # = sqrt(0.625 / 6) = 0.32274861; A = centred / 0.32274861.
    adv = _adv(variant, [1, 0, 1, 1, 0.5, 0], 2)
    np.testing.assert_allclose(adv, [1.5491933, -1.5491933, 0, 0, 0.7745967, -0.7745967], **close(atol=1e-5))
    assert adv[2] == 0.0 and adv[3] == 0.0  # the tied group is exactly 0, not a rounding step away


@VARIANTS
def test_the_scale_is_the_batch_not_the_group(variant):
    # GRPO would give both groups +-0.7071 (each divided by its own std); here the group with the
    # larger spread keeps the larger advantages: [0, 4] -> [-2, 2], [0, 1] -> [-0.5, 0.5];
    # batch std = sqrt((4 + 4 + 0.25 + 0.25) / 4) = sqrt(2.125) = 1.4577380.
    adv = _adv(variant, [0, 4, 0, 1], 2)
    np.testing.assert_allclose(adv, [-1.3719887, 1.3719887, -0.3429972, 0.3429972], **close(atol=1e-5))


@VARIANTS
def test_relation_to_dr_grpo(variant):
    # Dr. GRPO's group-centred advantage divided by its batch std (population, ddof 0).
    r = np.asarray([1, 0, 0, 1, 2, 0, 0, 0, 0.5, 0.25, 1, 0, 3, 3, 3, 3], np.float32)
    dr = np.asarray(dr_grpo_advantages(jnp.asarray(r), 4))
    np.testing.assert_allclose(_adv(variant, r, 4), dr / (dr.std() + 1e-6), **close(atol=1e-5))


@VARIANTS
@pytest.mark.parametrize("uniform", [[0, 0, 0, 0], [1, 1, 1, 1], [0.1, 0.1, 0.1, 0.1]], ids=["zeros", "ones", "tenths"])
def test_all_tied_is_exactly_zero(variant, uniform):
    assert np.array_equal(_adv(variant, uniform * 2, 4), np.zeros(8, np.float32))


def test_under_vmap():
    # Two independent batches: [1, 0] -> [1, -1] (centred +-0.5, batch std 0.5); [4, 2] -> [1, -1].
    adv = jax.vmap(lambda r: reinforce_pp_advantages(r, 2))(jnp.asarray([[1.0, 0.0], [4.0, 2.0]]))
    np.testing.assert_allclose(adv, [[1.0, -1.0], [1.0, -1.0]], **close(atol=1e-5))


@VARIANTS
def test_k2_kl_loss_term_and_its_gradient_by_hand(variant):
    # On-policy (ratio 1), token-mean over 3 real tokens (row 0: 2 tokens, row 1: 1, row 2: none).
    # Policy part: -A per token: (-1 - 1 + 0.5) / 3 = -0.5.
    # k2 = (logp - ref)^2 / 2: row 0 d = [0.5, -1] -> [0.125, 0.5]; row 1 d = [2] -> 2. Sum 2.625.
    # Loss = -0.5 + beta * 2.625 / 3 = -0.5 + 0.000875 = -0.499125 (beta = 1e-3).
    # Gradient: -A / 3 + beta * (logp - ref) / 3 per real token (k2's gradient is the reverse-KL one).
    cfg = ReinforcePPConfig()
    logp = jnp.asarray([[-1.0, -2.0, 0.0], [-1.0, 0.0, 0.0], [-1.0, -1.0, -1.0]])
    ref = jnp.asarray([[-1.5, -1.0, 3.0], [-3.0, 9.0, 9.0], [-9.0, -9.0, -9.0]])
    mask = jnp.asarray([[1.0, 1, 0], [1, 0, 0], [0, 0, 0]])
    example = TrainExample(
        prompt_tokens=jnp.zeros((3, 1), jnp.int32), prompt_mask=jnp.ones((3, 1)),
        completion_tokens=jnp.zeros((3, 3), jnp.int32), completion_mask=mask,
        advantages=jnp.asarray([1.0, -0.5, 4.0]), ref_logp=ref,
    )  # fmt: skip

    def loss_of(lp):
        out = policy_gradient_loss(
            lp, jnp.zeros_like(lp), example, policy_loss=registry.get("policy_loss", cfg.policy_loss),
            aggregate=registry.get("loss_aggregation", cfg.loss_agg_mode),
            kl_estimator=registry.get("kl_estimator", cfg.kl_estimator), beta=cfg.beta,
            eps_low=cfg.epsilon_low, eps_high=cfg.epsilon_high, dual_clip=None, max_len=3,
        )  # fmt: skip
        return out.total / out.denom

    value, grad = variant(jax.value_and_grad(loss_of))(logp)
    np.testing.assert_allclose(value, -0.499125, **close(atol=1e-6))
    expected = np.asarray([[-1 + 1e-3 * 0.5, -1 + 1e-3 * -1, 0], [0.5 + 1e-3 * 2, 0, 0], [0, 0, 0]]) / 3
    np.testing.assert_allclose(grad, expected, **close(atol=1e-6))


def test_config_defaults_and_registration():
    cfg = ReinforcePPConfig()
    assert (cfg.advantage_estimator, cfg.kl_estimator, cfg.beta, cfg.loss_agg_mode) == (
        "reinforce_pp", "k2", 1e-3, "token-mean"
    )
    assert registry.get("advantage_estimator", "reinforce_pp") is reinforce_pp_advantages
    assert registry.registry.provider("advantage_estimator", "reinforce_pp") == "algo-reinforce-pp"
