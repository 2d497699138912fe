"""A GRPO step runs on each model family loaded from its Hugging Face folder: the sampler
generates with the family's windows and rotary tables, the learner's log-prob, reference and
update passes run on the same block, and the parameters move.

A step compiles the sampler and every pass (over 10 s on CPU): the e2e tier.
"""

from pathlib import Path

import jax
import numpy as np
import pytest

import rewards
from algo_grpo import GRPOConfig, GRPOLearner
from algo_gspo import GSPOConfig, GSPOLearner
from rl_core.config import RolloutConfig, TrainingConfig
from rl_core.data import Prompt
from rl_models.hf import load_hf_model, load_hf_tokenizer

HF = Path(__file__).resolve().parents[1] / "fixtures" / "hf"
PROMPTS = [Prompt(f"What is {a} + {b}? The answer is", {"answer": str(a + b)}) for a in range(1, 4) for b in range(1, 4)]


def distinct_characters(prompts, completions, **_):
    """A reward that differs between the completions of an untrained model (so advantages are not 0)."""
    return [len(set(text)) / 10 for text in completions]


@pytest.mark.e2e
@pytest.mark.parametrize("name", ["gemma3_text", "mistral", "smollm3", "qwen3_yarn", "gemma3", "qwen3_moe", "gpt_oss",
                                  "llama_bias", "smollm3_bias", "olmo2", "olmo3", "phi3", "gemma2"])
def test_a_grpo_step_trains_each_family(name):
    _step_moves_the_parameters(GRPOLearner, GRPOConfig(group_size=2, beta=0.04), name)


@pytest.mark.e2e
@pytest.mark.parametrize("name", ["qwen3_moe", "gpt_oss"])
def test_a_gspo_step_trains_each_mixture_of_experts(name):
    """GSPO (sequence-level ratios, introduced for mixtures of experts) on both MoE families."""
    _step_moves_the_parameters(GSPOLearner, GSPOConfig(group_size=2, beta=0.04), name)


def _step_moves_the_parameters(learner_class, config, name):
    policy = load_hf_model(HF / name)
    learner = learner_class(
        config,
        policy=policy,
        tokenizer=load_hf_tokenizer(HF / name),
        train_data=PROMPTS,
        training=TrainingConfig(prompts_per_step=2, optimizer="adamw", learning_rate=1e-3, max_grad_norm=1.0),
        rollout=RolloutConfig(max_new_tokens=8, max_prompt_tokens=16, temperature=1.0),
        reward_manager=rewards.RewardManager([distinct_characters]),
    )
    before = jax.tree.map(np.array, learner.params)
    metrics = learner.train_step()
    assert np.isfinite(metrics["train/loss"]) and np.isfinite(metrics["train/kl"])
    assert metrics["groups/uniform_frac"] < 1.0  # some group had unequal rewards: a real gradient
    moved = jax.tree.leaves(jax.tree.map(lambda a, b: float(np.abs(np.asarray(a) - b).max()), learner.params, before))
    assert max(moved) > 0
