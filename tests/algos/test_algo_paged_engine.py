"""GRPO and DAPO learners with `rollout.engine=paged`: they train as with the static sampler.

The whole GRPO/DAPO learner suites pass with paged as the default engine (checked when the
engine was added); this file keeps the wiring under test while the default is static.
"""


import numpy as np
import pytest
from flax import nnx

import rewards
import rl_models
from algo_dapo import DAPOConfig, DAPOLearner
from algo_grpo import GRPOConfig, GRPOLearner
from rl_core.config import RolloutConfig, TrainingConfig
from rl_core.data import Prompt
from rl_core.rollout.paged import PagedBackend
from rl_core.rollout.static import StaticBackend
from rl_core.rollout.sampler import GREEDY
from rl_core.testing import BAG_PAGING, BagPolicy
from tolerances import close

TOK = rl_models.CharTokenizer()
PROMPTS = [Prompt(f"{a}+{b}=", {"answer": str(a + b)}) for a in range(1, 5) for b in range(1, 5)]


def digit_fraction(prompts, completions, **_):
    return [sum(c.isdigit() for c in text) / max(len(text), 1) for text in completions]


def learner(cls, config, engine, paging=BAG_PAGING):
    return cls(
        config,
        policy=BagPolicy(TOK.vocab_size, rngs=nnx.Rngs(0)),
        paging=paging,
        tokenizer=TOK,
        train_data=PROMPTS,
        training=TrainingConfig(prompts_per_step=2, optimizer="sgd", learning_rate=1.0, max_grad_norm=None),
        rollout=RolloutConfig(max_new_tokens=6, max_prompt_tokens=8, engine=engine,
                              options={"slots": 3, "page_size": 4, "steps_per_sync": 2} if engine == "paged" else {}),
        reward_manager=rewards.RewardManager([rewards.numeric_answer_reward(), digit_fraction]),
    )


@pytest.mark.parametrize(("cls", "config"), [
    (GRPOLearner, GRPOConfig(group_size=4, beta=0.04, num_iterations=2)),
    (DAPOLearner, DAPOConfig(group_size=4, max_gen_batches=3)),
], ids=["grpo", "dapo"])
def test_learner_trains_with_the_paged_engine(cls, config):
    paged = learner(cls, config, "paged")
    assert isinstance(paged.generator.backend, PagedBackend)
    history = paged.train(num_steps=2)
    assert len(history) == 2 and all(np.isfinite(h["train/loss"]) for h in history)
    assert all(pool.in_use == 0 for pool in paged.generator.backend.pools)
    # completions are stamped with the weights' version: the step whose parameters made them
    tokens, mask = paged.generator.encode(PROMPTS[:2])
    assert set(np.asarray(paged._generate(tokens, mask, num_samples=2).version)) == {2}


def test_greedy_rollouts_of_both_engines_agree_in_a_learner():
    config = GRPOConfig(group_size=4)
    paged, static = learner(GRPOLearner, config, "paged"), learner(GRPOLearner, config, "static")
    assert isinstance(static.generator.backend, StaticBackend)
    tokens, mask = paged.generator.encode(PROMPTS[:4])
    a = paged._generate(tokens, mask, GREEDY, num_samples=2)
    b = static._generate(tokens, mask, GREEDY, num_samples=2)
    np.testing.assert_array_equal(a.tokens, np.asarray(b.tokens))
    np.testing.assert_allclose(a.logp, np.asarray(b.logp), **close(atol=1e-5))


def test_the_paged_engine_without_its_adapter_is_a_clear_error():
    """The engine reaches the policy through `paging` (rl_core.policy.protocols.PagedModel), never its methods."""
    config = GRPOConfig(group_size=4)
    with pytest.raises(TypeError, match=r"engine = 'paged' needs the policy's paged adapter \(BagPolicy\): pass paging="):
        learner(GRPOLearner, config, "paged", paging=None)
    with pytest.raises(TypeError, match="BagPolicy lacks cache_spec, forward, inference_copy"):
        learner(GRPOLearner, config, "paged", paging=BagPolicy(TOK.vocab_size, rngs=nnx.Rngs(0)))
    assert isinstance(learner(GRPOLearner, config, "static", paging=None).generator.backend, StaticBackend)
