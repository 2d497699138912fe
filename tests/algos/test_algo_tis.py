"""Truncated importance sampling against sampler/trainer mismatch (`tis_cap`), for every GRPO-family algorithm:
every registered policy loss is weighted token by token, and a learner whose sampler's
log-probs are off by known factors trains with weights min(exp(old - sampler), C)."""


import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import rewards
import rl_models
from algo_grpo import GRPOConfig, GRPOLearner
from rl_core import registry
from rl_core.math.aggregation import per_token
from rl_core.config import RolloutConfig, TrainingConfig
from rl_core.data import Prompt
from rl_core.correction_config import resolve_correction
from rl_core.train.objective import policy_gradient_loss
from rl_core.types import TrainExample
from rl_core.testing import BagPolicy, MismatchedSampler, stage
from tolerances import approx, close

# MismatchedSampler.on_doubling's tokenizer and reward (rl_core.testing needs neither package)
DOUBLING = {"tokenizer": rl_models.CharTokenizer(),
            "reward_manager": rewards.RewardManager([rewards.numeric_answer_reward()])}

VARIANTS = pytest.mark.parametrize("variant", [lambda f: f, jax.jit], ids=["eager", "jit"])
TOK = rl_models.CharTokenizer()

# One completion of 3 real tokens (and a pad), A = 1, on-policy (ratio 1, so the surrogate is -1 per token).
# The sampler under-rates the tokens by factors [1.5, 3, 0.5]: weights min(pi_old / pi_sampler, 2)
# = [1.5, 2, 0.5], and the pad keeps weight 1 but mask 0.
LOGP = jnp.asarray([[-1.0, -2.0, -0.5, -4.0]])
SAMPLER = LOGP - np.log(np.asarray([[1.5, 3.0, 0.5, 1.0]], np.float32))  # on the host: exact on any backend
MASK = jnp.asarray([[1.0, 1.0, 1.0, 0.0]])


def _loss(logp, tis_cap):
    example = TrainExample(
        prompt_tokens=jnp.zeros((1, 1), jnp.int32), prompt_mask=jnp.ones((1, 1)),
        completion_tokens=jnp.zeros((1, 4), jnp.int32), completion_mask=MASK,
        advantages=jnp.ones(1), sampler_logp=SAMPLER,
    )  # fmt: skip
    return policy_gradient_loss(
        logp, jnp.zeros_like(logp), example, policy_loss=registry.get("policy_loss", "grpo"),
        aggregate=registry.get("loss_aggregation", "token-mean"), kl_estimator=None, beta=0.0,
        eps_low=0.2, eps_high=0.2, dual_clip=None, max_len=4, tis_cap=tis_cap,
    )  # fmt: skip


@VARIANTS
def test_weighted_loss_gradient_and_metrics_by_hand(variant):
    def mean(lp):
        out = _loss(lp, 2.0)
        return out.total / out.denom, out

    (value, out), grad = variant(jax.value_and_grad(mean, has_aux=True))(LOGP)
    np.testing.assert_allclose(value, -(1.5 + 2.0 + 0.5) / 3, **close(atol=1e-6))  # -4/3
    np.testing.assert_allclose(grad, [[-1.5 / 3, -2.0 / 3, -0.5 / 3, 0.0]], **close(atol=1e-6))

    def metric(name):
        total, count = out.means[name]
        return float(total / count)

    assert metric("drift/tis_weight_mean") == approx(4 / 3, abs=1e-6)
    assert metric("drift/tis_capped_frac") == approx(1 / 3, abs=1e-6)  # the factor 3 hit C = 2
    # the mismatch itself, |log pi_old - log pi_sampler|: mean (log 1.5 + log 3 + log 2) / 3, max log 3
    assert metric("drift/logp_abs_mean") == approx(np.log(9) / 3, abs=1e-6)
    assert float(out.maxima["drift/logp_abs_max"]) == approx(np.log(3), abs=1e-6)


def test_off_by_default_the_loss_is_unweighted():
    out = _loss(LOGP, None)
    assert float(out.total / out.denom) == approx(-1.0, abs=1e-6)
    assert "drift/tis_weight_mean" not in out.means and "drift/logp_abs_mean" in out.means
    assert GRPOConfig().tis_cap is None


# Every policy loss under the same off-policy toy batch: two completions (A = +1, -0.5) of
# 4 tokens, the second with a pad; the current policy moved a little from the behaviour one
# (ratios inside any clip range used here), and the sampler rated the tokens by factors
# 1.5, 3, 0.5, 1.2 / 0.8, 4, 1.1 (pad) below or above the trainer's behaviour log-probs.
OLD = jnp.asarray([[-1.0, -2.0, -0.5, -1.5], [-0.7, -1.2, -2.2, -4.0]])
CURRENT = OLD + jnp.asarray([[0.01, -0.02, 0.015, 0.005], [-0.01, 0.02, 0.01, 0.0]])
FACTORS = np.asarray([[1.5, 3.0, 0.5, 1.2], [0.8, 4.0, 1.1, 7.0]])  # pi_old / pi_sampler per token
TWO_MASK = jnp.asarray([[1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0, 0.0]])
CAP = 2.0


def every_policy_loss() -> list[str]:
    names = registry.registry.names("policy_loss")
    # each algorithm's own loss is among them (the registry loads every installed algorithm)
    assert {registry.get_algorithm(a).config().policy_loss for a in registry.registry.names("algorithm")} <= set(names)
    return names


@pytest.mark.parametrize("name", every_policy_loss())
def test_every_policy_loss_is_weighted_token_by_token(name):
    """The TIS loss is sum_t l_t * min(pi_old / pi_sampler, C) * m_t over the loss's own
    per-token terms l_t (a per-sequence loss spread over its tokens), in value and gradient."""
    fn = registry.get("policy_loss", name)
    adv = jnp.asarray([1.0, -0.5])
    kwargs = dict(eps_low=0.2, eps_high=0.2, dual_clip=None)
    example = TrainExample(
        prompt_tokens=jnp.zeros((2, 1), jnp.int32), prompt_mask=jnp.ones((2, 1)),
        completion_tokens=jnp.zeros((2, 4), jnp.int32), completion_mask=TWO_MASK,
        advantages=adv, old_logp=OLD, sampler_logp=OLD - np.log(np.asarray(FACTORS, np.float32)),
    )  # fmt: skip
    weights = np.minimum(FACTORS, CAP) * np.asarray(TWO_MASK)  # [[1.5, 2, 0.5, 1.2], [0.8, 2, 1.1, 0]]

    def tis_total(lp):
        return policy_gradient_loss(lp, jnp.zeros_like(lp), example, policy_loss=fn,
                         aggregate=registry.get("loss_aggregation", "token-mean"), kl_estimator=None, beta=0.0,
                         max_len=4, tis_cap=CAP, **kwargs).total  # fmt: skip

    def expected_total(lp):
        per_tok = per_token(fn(lp, OLD, adv, TWO_MASK, **kwargs)[0], TWO_MASK)
        return jnp.sum(per_tok * weights)

    value, grad = jax.jit(jax.value_and_grad(tis_total))(CURRENT)
    want_value, want_grad = jax.jit(jax.value_and_grad(expected_total))(CURRENT)
    np.testing.assert_allclose(value, want_value, **close(rtol=1e-5, atol=1e-6))
    np.testing.assert_allclose(grad, want_grad, **close(rtol=1e-5, atol=1e-6))
    unweighted = jnp.sum(per_token(fn(CURRENT, OLD, adv, TWO_MASK, **kwargs)[0], TWO_MASK) * TWO_MASK)
    assert abs(float(value - unweighted)) > 0.1  # the weights matter here


def _learner(**config):
    return GRPOLearner(
        GRPOConfig(group_size=2, beta=0.0, **config),
        policy=BagPolicy(TOK.vocab_size, rngs=nnx.Rngs(0)),
        tokenizer=TOK,
        train_data=[Prompt(f"{a}+{a}=", {"answer": str(2 * a)}) for a in range(1, 5)],
        training=TrainingConfig(prompts_per_step=2),
        rollout=RolloutConfig(max_new_tokens=3, max_prompt_tokens=8),
        reward_manager=rewards.RewardManager([rewards.numeric_answer_reward()]),
    )


def test_on_an_on_policy_step_it_needs_no_behaviour_pass():
    """The loss's stop_gradient(logp) is the behaviour policy's log-probs in value: the weights
    divide it by the sampler's, and no separate pass runs (rl_core.train.behaviour)."""
    plain, tis = _learner(), _learner(tis_cap=2.0)
    assert not plain._passes.off_policy and not tis._passes.off_policy
    assert not plain._passes.behaviour and not tis._passes.behaviour and resolve_correction(tis._config).on
    prompts = plain.supply().stream.next(2)
    assert plain.produce_examples(prompts).example.old_logp is None
    batch = tis.produce_examples(prompts)
    assert batch.example.old_logp is None and batch.example.sampler_logp is not None
    metrics = tis.train_step()
    # sampler and trainer run the same float32 policy here: weights 1, nothing capped
    assert metrics["drift/tis_weight_mean"] == approx(1.0, abs=1e-4)
    assert metrics["drift/tis_capped_frac"] == 0.0


def test_a_learner_with_a_mismatched_sampler_weighs_each_token_by_the_capped_ratio():
    learner = MismatchedSampler.on_doubling(GRPOConfig(group_size=2, beta=0.0, tis_cap=CAP), **DOUBLING)
    metrics = learner.train_step()
    example = learner.last_example
    mask = np.asarray(example.completion_mask)
    old, sampler = learner.last_old_logp, np.asarray(example.sampler_logp)
    weights = np.minimum(np.exp(old - sampler), CAP)  # ~0.5, 1.5 and 2 (3 capped): trainer vs sampler
    real = mask > 0
    assert real.sum() >= 6 and {0.5, 1.5, 2.0} <= {round(float(w), 2) for w in weights[real]}
    assert metrics["drift/tis_weight_mean"] == approx(weights[real].mean(), rel=1e-4)
    assert metrics["drift/tis_capped_frac"] == approx((weights[real] >= CAP).mean(), abs=1e-6)
    # one iteration, one mini-batch: rho = 1, so GRPO's token term is -A * w; its default
    # aggregation (seq-mean-token-mean) averages tokens within each completion, then completions
    adv = np.asarray(example.advantages)[:, None]
    rows = real.any(axis=1)
    per_row = (-adv * weights * mask).sum(axis=1)[rows] / mask.sum(axis=1)[rows]
    assert metrics["train/policy_loss"] == approx(per_row.mean(), rel=1e-4, abs=1e-6)


def test_the_correction_without_a_behaviour_pass_equals_it_with_one():
    """On an on-policy step the capped weights of stop_gradient(logp) / pi_sampler equal those of
    a recomputed behaviour pass: the same loss, weights and update to float32 rounding (the pass
    is another compiled program, rounded differently in the last bit)."""
    learner = MismatchedSampler.on_doubling(GRPOConfig(group_size=2, beta=0.0, tis_cap=CAP), **DOUBLING)
    initial = learner.state._replace(models=jax.tree.map(lambda x: x.copy(), learner.state.models))
    example = learner.produce_examples(learner.supply().stream.next(2)).example
    assert example.old_logp is None
    (fast,) = learner.update_models(example)["policy"]
    fast_params = jax.tree.map(np.asarray, learner.params)
    stage(learner, initial)
    (recomputed,) = learner.update_models(example._replace(old_logp=learner.last_old_logp))["policy"]
    for name in ("drift/tis_weight_mean", "drift/tis_capped_frac", "rollout/mismatch_logp_abs_mean"):
        total, count = fast["means"][name]
        want_total, want_count = recomputed["means"][name]
        assert total / count == approx(want_total / want_count, rel=1e-5, abs=1e-7), name
    assert fast["means"]["drift/tis_capped_frac"][0] > 0  # the factor 3 is capped: the weights matter
    assert fast["loss"] == approx(recomputed["loss"], rel=1e-5, abs=1e-8)
    for got, want in zip(jax.tree.leaves(fast_params), jax.tree.leaves(learner.params), strict=True):
        np.testing.assert_allclose(got, np.asarray(want), **close(rtol=1e-5, atol=1e-7))


def test_greedy_sampling_with_tis_is_refused():
    with pytest.raises(ValueError, match="temperature = 0: greedy tokens are not samples"):
        GRPOLearner(
            GRPOConfig(group_size=2, beta=0.0, tis_cap=2.0),
            policy=BagPolicy(TOK.vocab_size, rngs=nnx.Rngs(0)),
            tokenizer=TOK,
            train_data=[Prompt("1+1=", {"answer": "2"})],
            training=TrainingConfig(prompts_per_step=1),
            rollout=RolloutConfig(max_new_tokens=3, max_prompt_tokens=8, temperature=0.0),
            reward_manager=rewards.RewardManager([rewards.numeric_answer_reward()]),
        )
