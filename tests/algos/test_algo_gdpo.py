"""GDPO's estimator in the group pipeline (`algorithm.advantage_estimator=gdpo`): the learner
passes each reward function's scores and weights, and a group variant trains with it."""

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import rewards
import rl_models
from rl_core import registry
from rl_core.config import RolloutConfig, TrainingConfig
from rl_core.data import Prompt
from rl_core.math.advantages import gdpo_advantages
from rl_core.testing import tree_max_abs_diff
from rl_core.testing import make_groups, train_counting_compiles
from tolerances import close

TOK = rl_models.CharTokenizer()
MODEL = rl_models.TransformerConfig.tiny(
    TOK.vocab_size, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, mlp_hidden_size=64
)
G = 4
PROMPTS = [Prompt(f"{a}+{b}=", {"answer": str(a + b)}) for a in range(1, 10) for b in range(1, 10)]


def digit_fraction(prompts, completions, **_):
    return [sum(c.isdigit() for c in text) / max(len(text), 1) for text in completions]


def build(name: str):
    algorithm = registry.get_algorithm(name)
    config = dataclasses.replace(algorithm.config(), group_size=G, advantage_estimator="gdpo")
    manager = rewards.RewardManager(
        [rewards.numeric_answer_reward(), rewards.RewardSpec(digit_fraction, weight=0.5)], correctness="digit_fraction"
    )
    return algorithm.learner(
        config,
        policy=rl_models.Transformer(MODEL, rngs=nnx.Rngs(0)),
        tokenizer=TOK,
        train_data=PROMPTS,
        training=TrainingConfig(prompts_per_step=2, num_steps=3, learning_rate=1e-3),
        rollout=RolloutConfig(max_new_tokens=4, max_prompt_tokens=8),
        reward_manager=manager,
    )


def test_config_takes_gdpo_by_name():
    from algo_grpo import GRPOConfig

    assert GRPOConfig.from_dict({"advantage_estimator": "gdpo"}).advantage_estimator == "gdpo"


def test_the_learner_passes_every_functions_scores_and_weights():
    learner = build("grpo")
    correct = np.asarray([1, 1, 0, 0, 0, 1, 0, 1], np.float32)
    length = np.asarray([0, 10, 0, 10, 4, 4, 4, 8], np.float32)
    groups = make_groups([Prompt("1+1=", {}), Prompt("1+2=", {})], correct + 0.5 * length, group_size=G,
                         completion_tokens=np.full((8, 4), 5), lengths=[4] * 8)  # fmt: skip
    groups = dataclasses.replace(groups, reward_scores={"numeric_answer": correct, "digit_fraction": length})
    got = learner._compute_advantages(groups)
    expected = gdpo_advantages(jnp.asarray(groups.rewards), G, scores=jnp.asarray(np.stack([correct, length])),
                               weights=jnp.asarray([1.0, 0.5]))  # fmt: skip
    np.testing.assert_allclose(got, np.asarray(expected), **close(atol=1e-6))
    # not the estimator on the weighted total alone
    assert not np.allclose(got, np.asarray(gdpo_advantages(jnp.asarray(groups.rewards), G)),
                           **close(rtol=1e-5, atol=1e-3))
    # groups without per-function scores: the total is the one reward
    bare = dataclasses.replace(groups, reward_scores={})
    np.testing.assert_allclose(learner._compute_advantages(bare), gdpo_advantages(jnp.asarray(groups.rewards), G),
                               **close(atol=1e-6))  # fmt: skip


# a learner each: GRPO in the fast tier, DAPO in e2e
@pytest.mark.parametrize("name", ["grpo", pytest.param("dapo", marks=pytest.mark.e2e)])
def test_a_group_variant_trains_with_gdpo_and_compiles_once(name):
    learner = build(name)
    before = jax.tree.map(np.array, learner.params)
    history, new = train_counting_compiles(learner)
    assert all(math.isfinite(m["train/loss"]) for m in history)
    assert all(m["train/skipped_updates"] == 0 for m in history)
    assert all(math.isfinite(m["advantages/mean"]) for m in history)
    assert tree_max_abs_diff(before, jax.tree.map(np.array, learner.params)) > 0
    assert new == [0, 0]
