"""RLOO: the leave-one-out advantage through the GRPO loss, by hand."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from algo_dr_grpo import dr_grpo_advantages
from algo_grpo import GRPOConfig
from algo_rloo import RLOOConfig
from rl_core import registry
from rl_core.train.objective import policy_gradient_loss
from rl_core.types import TrainExample
from tolerances import close

VARIANTS = pytest.mark.parametrize("variant", [lambda f: f, jax.jit], ids=["eager", "jit"])
RLOO = registry.get("advantage_estimator", RLOOConfig().advantage_estimator)


@VARIANTS
def test_leave_one_out_by_hand(variant):
    # G = 4, [1, 0, 0, 1]: A_0 = 1 - (0 + 0 + 1)/3 = 2/3, A_1 = 0 - (1 + 0 + 1)/3 = -2/3.
    # G = 4, [3, 3, 3, 3]: tied, exactly 0. No std anywhere.
    adv = np.asarray(variant(lambda r: RLOO(r, 4))(jnp.asarray([1, 0, 0, 1, 3, 3, 3, 3], jnp.float32)))
    np.testing.assert_allclose(adv, [2 / 3, -2 / 3, -2 / 3, 2 / 3, 0, 0, 0, 0], **close(atol=1e-6))
    assert np.array_equal(adv[4:], np.zeros(4))


@VARIANTS
def test_relation_to_dr_grpo(variant):
    # r_i - mean_{j != i} r_j = G / (G - 1) * (r_i - mean(r)).
    r = jnp.asarray([0.5, 0.25, 1, 0, 2, 0, 0, 0], jnp.float32)
    np.testing.assert_allclose(variant(lambda x: RLOO(x, 4))(r), 4 / 3 * dr_grpo_advantages(r, 4), **close(atol=1e-6))


@VARIANTS
def test_loss_and_gradient_with_one_token_and_fully_masked_rows(variant):
    # Group [1, 0, 0] (G = 3): A = [1, -0.5, -0.5]. Row 0: 2 tokens, row 1: 1 token, row 2: fully masked.
    # On-policy, seq-mean-token-sum over the 2 non-empty rows: token sums -1 * 2 and +0.5 * 1,
    # loss = (-2 + 0.5) / 2 = -0.75; gradient -A / 2 per real token (no division by |y_i|):
    # row 0 [-0.5, -0.5], row 1 [0.25], row 2 none.
    cfg = RLOOConfig()
    mask = jnp.asarray([[1.0, 1.0], [1, 0], [0, 0]])
    example = TrainExample(
        prompt_tokens=jnp.zeros((3, 1), jnp.int32), prompt_mask=jnp.ones((3, 1)),
        completion_tokens=jnp.zeros((3, 2), jnp.int32), completion_mask=mask,
        advantages=RLOO(jnp.asarray([1.0, 0.0, 0.0]), 3),
    )  # fmt: skip

    def loss_of(lp):
        return _rloo_loss(lp, example, cfg, max_len=2)

    value, grad = variant(jax.value_and_grad(loss_of))(jnp.asarray([[-1.0, -2.0], [-0.5, jnp.nan], [jnp.inf, 0.0]]))
    np.testing.assert_allclose(value, -0.75, **close(atol=1e-6))
    np.testing.assert_allclose(grad, [[-0.5, -0.5], [0.25, 0.0], [0.0, 0.0]], **close(atol=1e-6))


def _rloo_loss(logp, example, cfg, *, max_len):
    """RLOO's aggregated loss (GRPO's loss with RLOO's settings) of `example` at `logp`."""
    out = policy_gradient_loss(
        logp, jnp.zeros_like(logp), example, policy_loss=registry.get("policy_loss", cfg.policy_loss),
        aggregate=registry.get("loss_aggregation", cfg.loss_agg_mode), kl_estimator=None, beta=cfg.beta,
        eps_low=cfg.epsilon_low, eps_high=cfg.epsilon_high, dual_clip=None, max_len=max_len,
    )  # fmt: skip
    return out.total / out.denom


def test_config_defaults_are_the_three_changes():
    cfg, parent = RLOOConfig(), GRPOConfig()
    assert (cfg.advantage_estimator, cfg.loss_agg_mode, cfg.beta) == ("rloo", "seq-mean-token-sum", 0.0)
    for name in ("group_size", "policy_loss", "epsilon_low", "epsilon_high", "num_iterations"):
        assert getattr(cfg, name) == getattr(parent, name)


@VARIANTS
def test_off_policy_the_ratio_is_per_token_so_one_drifted_token_clips_alone(variant):
    """The package's stated choice (GRPO's per-token ratio, not TRL's one ratio per completion).
    One completion, A = 1, 3 tokens; a later mini-batch sees token 0 at ratio 1.5 and the others at 1.
    Per token: token 0 is clipped at 1.2 (gradient 0), tokens 1 and 2 keep -A = -1 each:
    loss = -(1.2 + 1 + 1) = -3.2 (seq-mean-token-sum over one sequence).
    A completion-level ratio exp(sum log-ratio) = 1.5 would clip the whole completion: gradient 0 everywhere."""
    cfg = RLOOConfig()
    assert cfg.policy_loss == GRPOConfig().policy_loss == "grpo"
    example = TrainExample(
        prompt_tokens=jnp.zeros((1, 1), jnp.int32), prompt_mask=jnp.ones((1, 1)),
        completion_tokens=jnp.zeros((1, 3), jnp.int32), completion_mask=jnp.ones((1, 3)),
        advantages=jnp.asarray([1.0]), old_logp=jnp.full((1, 3), -1.0),
    )  # fmt: skip

    def loss_of(lp):
        return _rloo_loss(lp, example, cfg, max_len=3)

    value, grad = variant(jax.value_and_grad(loss_of))(example.old_logp.at[0, 0].add(np.log(1.5)))
    np.testing.assert_allclose(value, -3.2, **close(atol=1e-5))
    np.testing.assert_allclose(grad, [[0.0, -1.0, -1.0]], **close(atol=1e-6))
