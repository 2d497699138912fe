"""On-policy distillation's per-token term (rl_core.math.distillation) and the objective with it
(rl_core.train.objective, distill_coef): hand-computed values and gradients, with and without jit,
under vmap; zero loss and zero gradient where the student is the teacher; the settings' rules."""

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import rl_models
from algo_grpo import GRPOConfig
from rl_core import registry
from rl_core.config import ConfigError
from rl_core.math.advantages import zero_advantages
from rl_core.math.distillation import distill_advantages, sampled_reverse_kl
from rl_core.policy.logprobs import completion_logprobs
from rl_core.train.behaviour import LogprobPasses
from rl_core.train.objective import policy_gradient_loss, policy_objective
from rl_core.types import TrainExample
from tolerances import approx, close

VARIANTS = pytest.mark.parametrize("variant", [lambda f: f, jax.jit], ids=["eager", "jit"])

# Two completions of 4 positions, 3 + 2 real tokens (5 in all).
MASK = jnp.asarray([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0]])
LOGP = jnp.asarray([[-1.0, -0.5, -2.0, -3.0], [-0.7, -1.2, -0.4, -2.0]])
TEACHER = jnp.asarray([[-1.5, -0.5, -1.0, -9.0], [-0.2, -1.7, -5.0, -5.0]])
# teacher - logp on the real tokens: [[-0.5, 0, 1.0], [0.5, -0.5]]; times coef 0.5:
A_T = [[-0.25, 0.0, 0.5, 0.0], [0.25, -0.25, 0.0, 0.0]]


@VARIANTS
def test_per_token_advantage_by_hand(variant):
    zero = jnp.zeros(2)
    np.testing.assert_allclose(variant(lambda a: distill_advantages(a, LOGP, TEACHER, MASK, coef=0.5))(zero), A_T,
        **close())
    # beside an RL advantage per completion [1, -2]: each real token's A plus the same term
    adv = variant(lambda a: distill_advantages(a, LOGP, TEACHER, MASK, coef=0.5))(jnp.asarray([1.0, -2.0]))
    np.testing.assert_allclose(adv, [[0.75, 1.0, 1.5, 0.0], [-1.75, -2.25, 0.0, 0.0]], **close())
    # per-token advantages [B, T] (PPO's) take it the same way
    np.testing.assert_allclose(distill_advantages(jnp.ones((2, 4)), LOGP, TEACHER, MASK, coef=0.5),
                               np.asarray(A_T) + np.asarray(MASK), **close())
    # the one-sample reverse KL log pi - log pi_T
    np.testing.assert_allclose(sampled_reverse_kl(LOGP, TEACHER)[0, :3], [0.5, 0.0, -1.0], **close())


def test_per_token_advantage_under_vmap():
    one = jax.vmap(lambda a, lp, t, m: distill_advantages(a[None], lp[None], t[None], m[None], coef=0.5)[0])
    np.testing.assert_allclose(one(jnp.zeros(2), LOGP, TEACHER, MASK), A_T, **close())


def tinker_incorporate_kl_penalty(advantages, sampled_logprobs, teacher_logprobs, mask, kl_penalty_coef):
    """The Tinker cookbook's `incorporate_kl_penalty` (tinker_cookbook/distillation/train_on_policy.py,
    kl_discount_factor = 0), transcribed: per-token advantages plus the negative reverse KL."""
    reverse_kl = (sampled_logprobs - teacher_logprobs) * mask
    kl_advantages = -kl_penalty_coef * mask * reverse_kl
    return advantages + kl_advantages


def test_equals_the_tinker_cookbooks_formula_on_random_inputs():
    rng = np.random.default_rng(0)
    logp, teacher = -rng.exponential(2.0, (8, 16)), -rng.exponential(2.0, (8, 16))
    mask = (np.arange(16)[None, :] < rng.integers(1, 17, (8, 1))).astype(np.float32)
    adv = rng.normal(size=8)
    ours = distill_advantages(jnp.asarray(adv, jnp.float32), jnp.asarray(logp, jnp.float32),
                              jnp.asarray(teacher, jnp.float32), jnp.asarray(mask), coef=0.7)
    theirs = tinker_incorporate_kl_penalty(adv[:, None] * mask, logp, teacher, mask, 0.7)  # A on the action tokens
    np.testing.assert_allclose(np.asarray(ours), theirs, **close(atol=1e-5))


def test_the_term_carries_no_gradient():
    grad = jax.grad(lambda lp: jnp.sum(distill_advantages(jnp.zeros(2), lp, TEACHER, MASK, coef=0.5)))(LOGP)
    assert not np.any(np.asarray(grad))  # a fixed per-token reward, as the sources' stop-gradient


def test_shapes_must_agree():
    with pytest.raises(ValueError, match="same shape"):
        sampled_reverse_kl(LOGP, TEACHER[:, :3])


def loss(logp, *, teacher=TEACHER, adv=(0.0, 0.0), coef=0.5, old_logp=None, agg="token-mean"):
    example = TrainExample(
        prompt_tokens=jnp.zeros((2, 1), jnp.int32), prompt_mask=jnp.ones((2, 1)),
        completion_tokens=jnp.zeros((2, 4), jnp.int32), completion_mask=MASK, advantages=jnp.asarray(adv),
        old_logp=old_logp, teacher_logp=teacher,
    )  # fmt: skip
    out = policy_gradient_loss(
        logp, jnp.zeros_like(logp), example, policy_loss=registry.get("policy_loss", "grpo"),
        aggregate=registry.get("loss_aggregation", agg), kl_estimator=None, beta=0.0,
        eps_low=0.2, eps_high=0.2, dual_clip=None, max_len=4, distill_coef=coef,
    )  # fmt: skip
    return out.total / out.denom, out


@VARIANTS
def test_loss_and_gradient_by_hand(variant):
    # On-policy (old_logp = stop_gradient(logp), ratio 1): l_t = -A_t, token-mean over 5 tokens:
    # -(-0.25 + 0 + 0.5 + 0.25 - 0.25) / 5 = -0.05; d loss / d logp_t = -A_t / 5.
    (value, out), grad = variant(jax.value_and_grad(loss, has_aux=True))(LOGP)
    assert float(value) == approx(-0.05, abs=1e-6)
    np.testing.assert_allclose(grad, -np.asarray(A_T) / 5, **close(atol=1e-7))
    # train/distill_reverse_kl: mean of logp - teacher = (0.5 + 0 - 1.0 - 0.5 + 0.5) / 5 = -0.1
    total, count = out.means["train/distill_reverse_kl"]
    assert float(total / count) == approx(-0.1, abs=1e-6)
    # beside GRPO advantages [1, -2]: -(0.75 + 1 + 1.5 - 1.75 - 2.25) / 5 = 0.15
    assert float(variant(lambda lp: loss(lp, adv=(1.0, -2.0))[0])(LOGP)) == approx(0.15, abs=1e-6)


def test_off_policy_the_term_reads_the_behaviour_logprobs():
    # old_logp = logp - 0.1: ratio e^0.1 = 1.10517 (inside the clip) and A_t = 0.5 (teacher - old_logp),
    # on the real tokens: 0.5 * [[-0.4, 0.1, 1.1], [0.6, -0.4]], sum 0.5; loss = -1.10517 * 0.5 / 5
    value, _ = loss(LOGP, old_logp=LOGP - 0.1)
    assert float(value) == approx(-math.exp(0.1) * 0.5 / 5, abs=1e-6)


@VARIANTS
@pytest.mark.parametrize("adv", [(0.0, 0.0), (1.0, -2.0)])
def test_student_equal_to_teacher_adds_nothing(variant, adv):
    # teacher == student: the term is 0, so the loss and gradient are the RL advantage's alone
    with_teacher = variant(jax.value_and_grad(lambda lp: loss(lp, teacher=lp, adv=adv)[0]))(LOGP)
    without = variant(jax.value_and_grad(lambda lp: loss(lp, adv=adv, coef=0.0)[0]))(LOGP)
    assert float(with_teacher[0]) == float(without[0])
    assert np.array_equal(np.asarray(with_teacher[1]), np.asarray(without[1]))
    if adv == (0.0, 0.0):  # distillation alone: exactly zero
        assert float(with_teacher[0]) == 0.0 and not np.any(np.asarray(with_teacher[1]))


@pytest.mark.e2e  # compiles a model's loss and gradient (~6 s on CPU)
def test_a_real_model_distilled_from_itself_has_zero_loss_and_gradient():
    tok = rl_models.CharTokenizer()
    cfg = rl_models.TransformerConfig.tiny(tok.vocab_size, hidden_size=16, num_layers=1, num_heads=2,
                                           num_kv_heads=1, mlp_hidden_size=32)
    graphdef, params = nnx.split(rl_models.Transformer(cfg, rngs=nnx.Rngs(0)))
    prompts = jnp.asarray([[tok.bos_id, *tok.encode("1+2=")], [tok.bos_id, *tok.encode("3+4=")]], jnp.int32)
    completions = jnp.asarray([tok.encode("3x"), tok.encode("7y")], jnp.int32)
    mask = jnp.asarray([[1.0, 1.0], [1.0, 0.0]])
    teacher, _ = completion_logprobs(nnx.merge(graphdef, params), prompts, jnp.ones(prompts.shape), completions)
    example = TrainExample(prompt_tokens=prompts, prompt_mask=jnp.ones(prompts.shape), completion_tokens=completions,
                           completion_mask=mask, advantages=jnp.zeros(2), teacher_logp=teacher)
    settings = dict(temperature=1.0, chunk_tokens=64, policy_loss=registry.get("policy_loss", "grpo"),
                    aggregate=registry.get("loss_aggregation", "token-mean"), kl_estimator=None, beta=0.0,
                    eps_low=0.2, eps_high=0.2, dual_clip=None, max_len=2, distill_coef=1.0)

    def f(p):
        out = policy_objective(nnx.merge(graphdef, p), example, **settings)
        return out.total / out.denom

    value, grads = jax.jit(jax.value_and_grad(f))(params)
    assert float(value) == 0.0
    assert all(not np.any(np.asarray(g)) for g in jax.tree.leaves(grads))


def test_missing_teacher_logprobs_is_a_clear_error():
    with pytest.raises(ValueError, match="no teacher log-probs"):
        loss(LOGP, teacher=None)


def test_zero_estimator():
    assert np.array_equal(np.asarray(zero_advantages(jnp.asarray([1.0, 0.0, 3.0, 3.0]), 2)), np.zeros(4))
    assert registry.get("advantage_estimator", "zero") is zero_advantages


def test_settings():
    config = GRPOConfig(distill_coef=0.5, teacher="some/folder")
    assert LogprobPasses.of(config, num_mini_batches=1, async_rollout="off").teacher
    assert not LogprobPasses.of(GRPOConfig(), num_mini_batches=1, async_rollout="off").teacher
    assert GRPOConfig.from_dict(config.to_dict()) == config
    with pytest.raises(ConfigError, match="distill_coef = -1.0: must be >= 0"):
        GRPOConfig(distill_coef=-1.0)
    with pytest.raises(ConfigError, match="teacher = 'x': a teacher is only read with distill_coef > 0"):
        dataclasses.replace(GRPOConfig(), teacher="x")
