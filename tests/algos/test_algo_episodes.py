"""A learner trains on multi-turn episodes unchanged; a run with episodes resumes exactly.

(Every discovered algorithm trains on episodes in tests/trainer/test_trainer_multiturn.py.)

The policy is a tiny random transformer and the environment the built-in calculator
(`<calc>...</calc>`, registered by the trainer's entry point), so the turns are
random text; what is tested is the plumbing: observation tokens out of the loss,
episode records as reward-function fields, the metrics, and checkpoints of DAPO's
carried-over episode groups.
"""

import dataclasses

import jax
import numpy as np
import pytest
import rewards
import rl_models
from flax import nnx
from rl_core import registry
from rl_core.config import RolloutConfig, TrainingConfig
from rl_core.data import Prompt
from rl_core.learner import carry_to_json
from rl_core.testing import tree_max_abs_diff

TOK = rl_models.CharTokenizer()
MODEL = rl_models.TransformerConfig.tiny(
    TOK.vocab_size, hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1, mlp_hidden_size=32
)
PROMPTS = [Prompt(f"{a}*{b}=", {"answer": str(a * b)}) for a in range(11, 20) for b in range(11, 20)]
ROLLOUT = RolloutConfig(max_prompt_tokens=8, max_new_tokens=24, environment="calculator", max_turns=2,
                        max_turn_tokens=10)


def tool_use(prompts, completions, *, episode, **_):
    """Shaping from the episode field: a call of the tool scores, so groups are not tied."""
    return [min(e["state"]["tool_calls"], 1) * 0.5 + 0.1 * sum(r == "model" for r in e["turns"]) for e in episode]


def digits(prompts, completions, **_):
    return [sum(c.isdigit() for c in text) / max(len(text), 1) for text in completions]


def build(name, output_dir=None, **training):
    algorithm = registry.get_algorithm(name)
    config = dataclasses.replace(algorithm.config(), group_size=2)
    manager = rewards.RewardManager([rewards.numeric_answer_reward(), tool_use, digits], correctness="digits")
    policy = rl_models.Transformer(MODEL, rngs=nnx.Rngs(0))
    extra = {"critic": rl_models.value_model_from_policy}  # the models a learner trains besides the policy
    return algorithm.learner(
        config,
        policy=policy,
        **{kind: extra[kind](policy) for kind in algorithm.learner.extra_models},
        tokenizer=TOK,
        train_data=PROMPTS,
        training=TrainingConfig(**{"prompts_per_step": 2, "num_steps": 3, "learning_rate": 1e-2,
                                   "checkpoint_every_steps": 0, **training}),
        rollout=ROLLOUT,
        reward_manager=manager,
        output_dir=output_dir,
    )


def test_an_algorithm_trains_on_episodes():
    """Every variant trains on episodes in tests/trainer/test_trainer_multiturn.py (trainer compare);
    here one learner's step is checked in detail: the parameters move, the episode metrics exist."""
    learner = build("grpo")
    before = jax.tree.map(np.array, learner.params)
    metrics = learner.train_step()
    assert np.isfinite(metrics["train/loss"]) and metrics["train/skipped_updates"] == 0
    assert tree_max_abs_diff(before, learner.params) > 0
    for key in ("episodes/turns_mean", "episodes/tool_calls_mean", "episodes/tool_errors_mean",
                "episodes/model_token_frac"):
        assert key in metrics
    assert 0 < metrics["episodes/model_token_frac"] <= 1 and 1 <= metrics["episodes/turns_mean"] <= 2


@pytest.mark.e2e  # a whole run checkpointed and resumed: the e2e tier
def test_a_run_with_episodes_resumes_exactly(tmp_path):
    """DAPO carries surplus episode groups (with their records) through the checkpoint."""
    a = build("dapo", tmp_path / "run")
    a.train(3)  # three steps, then the checkpoint (on disk when train returns)
    carried = carry_to_json(a.state.carry)
    assert carried["carry"]["row_fields"]["episode"]  # surplus episodes, records and all, in the checkpoint
    want = [a.train_step() for _ in range(2)]
    b = build("dapo", tmp_path / "run")
    assert b.resume(log=lambda line: None) and b.step == 3
    assert carry_to_json(b.state.carry) == carried
    got = [b.train_step() for _ in range(2)]
    assert tree_max_abs_diff(a.params, b.params) == 0.0
    for m_a, m_b in zip(want, got, strict=True):
        for key in m_a:
            if not key.startswith(("time/", "perf/")):
                assert m_a[key] == m_b[key], key
