"""Truncated importance sampling against sampler/trainer mismatch (`tis_cap`), for every GRPO-family algorithm."""

import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import rewards
import rl_models
from algo_grpo import GRPOConfig, GRPOLearner
from algo_grpo.loss import grpo_loss
from rl_core import registry
from rl_core.config import RolloutConfig, TrainingConfig
from rl_core.data import Prompt
from rl_core.types import TrainExample

sys.path.insert(0, str(Path(__file__).parent / "fixtures"))
from algo_test_doubles import BagPolicy  # noqa: E402

VARIANTS = pytest.mark.parametrize("variant", [lambda f: f, jax.jit], ids=["eager", "jit"])
TOK = rl_models.CharTokenizer()

# One completion of 3 real tokens (and a pad), A = 1, on-policy (ratio 1, so the surrogate is -1 per token).
# The sampler under-rates the tokens by factors [1.5, 3, 0.5]: weights min(pi_old / pi_sampler, 2)
# = [1.5, 2, 0.5], and the pad keeps weight 1 but mask 0.
LOGP = jnp.asarray([[-1.0, -2.0, -0.5, -4.0]])
SAMPLER = LOGP - jnp.log(jnp.asarray([[1.5, 3.0, 0.5, 1.0]]))
MASK = jnp.asarray([[1.0, 1.0, 1.0, 0.0]])


def _loss(logp, tis_cap):
    example = TrainExample(
        prompt_tokens=jnp.zeros((1, 1), jnp.int32), prompt_mask=jnp.ones((1, 1)),
        completion_tokens=jnp.zeros((1, 4), jnp.int32), completion_mask=MASK,
        advantages=jnp.ones(1), sampler_logp=SAMPLER,
    )  # fmt: skip
    return grpo_loss(
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
    np.testing.assert_allclose(value, -(1.5 + 2.0 + 0.5) / 3, atol=1e-6)  # -4/3
    np.testing.assert_allclose(grad, [[-1.5 / 3, -2.0 / 3, -0.5 / 3, 0.0]], atol=1e-6)

    def metric(name):
        total, count = out.means[name]
        return float(total / count)

    assert metric("drift/tis_weight_mean") == pytest.approx(4 / 3, abs=1e-6)
    assert metric("drift/tis_capped_frac") == pytest.approx(1 / 3, abs=1e-6)  # the factor 3 hit C = 2
    # the mismatch itself, |log pi_old - log pi_sampler|: mean (log 1.5 + log 3 + log 2) / 3, max log 3
    assert metric("drift/logp_abs_mean") == pytest.approx(np.log(9) / 3, abs=1e-6)
    assert float(out.maxima["drift/logp_abs_max"]) == pytest.approx(np.log(3), abs=1e-6)


def test_off_by_default_the_loss_is_unweighted():
    out = _loss(LOGP, None)
    assert float(out.total / out.denom) == pytest.approx(-1.0, abs=1e-6)
    assert "drift/tis_weight_mean" not in out.means and "drift/logp_abs_mean" in out.means
    assert GRPOConfig().tis_cap is None


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


def test_on_it_records_behaviour_logprobs_even_on_an_on_policy_step():
    plain, tis = _learner(), _learner(tis_cap=2.0)
    assert not plain.update_is_off_policy() and not tis.update_is_off_policy()
    assert not plain.needs_behaviour_logprobs() and tis.needs_behaviour_logprobs()
    prompts = plain.data.next(2)
    assert plain.produce_examples(prompts).example.old_logp is None
    batch = tis.produce_examples(prompts)
    assert batch.example.old_logp is not None and batch.example.old_logp.shape == batch.example.sampler_logp.shape
    metrics = tis.train_step()
    # sampler and trainer run the same float32 policy here: weights 1, nothing capped
    assert metrics["drift/tis_weight_mean"] == pytest.approx(1.0, abs=1e-4)
    assert metrics["drift/tis_capped_frac"] == 0.0


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
