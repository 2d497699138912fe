"""PPO's own changes: the critic beside the policy, KL in the rewards, GAE, warm-up, resume, LoRA.

What every algorithm must do is in test_algo_conformance.py (PPO included); the math
(GAE, the value loss) in tests/rl_core/test_math_returns.py and test_math_value_losses.py.
"""

import dataclasses
import shutil

import jax
import numpy as np
import pytest
import rewards
from algo_grpo import GRPOConfig
from algo_ppo import PPOConfig, PPOLearner
from flax import nnx
from rl_core.config import ConfigError, RolloutConfig, TrainingConfig
from rl_core.data import Prompt
from rl_core.learner import state_arrays
from rl_core.math.returns import gae, token_rewards, whiten
from rl_core.testing import stage
from rl_models import (
    CharTokenizer,
    Transformer,
    TransformerConfig,
    value_model_from_policy,
)
from rl_models.lora import add_adapters
from tolerances import close

TOK = CharTokenizer()
MODEL = TransformerConfig.tiny(TOK.vocab_size, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1,
                               mlp_hidden_size=64)
PROMPTS = [Prompt(f"{a}+{b}=", {"answer": str(a + b)}) for a in range(1, 10) for b in range(1, 10)]


def length_fraction(prompts, completions, **_):
    """Shaping reward that varies even for an untrained policy (so every step has a gradient)."""
    return [len(text) / 5 for text in completions]


def make_learner(config=None, *, policy=None, output_dir=None, **training):
    policy = policy or Transformer(MODEL, rngs=nnx.Rngs(0))
    return PPOLearner(
        config or PPOConfig(beta=0.05, critic_warmup_steps=2, critic_learning_rate=2e-2),
        policy=policy,
        critic=value_model_from_policy(policy),
        tokenizer=TOK,
        train_data=PROMPTS,
        training=TrainingConfig(**{"optimizer": "adamw", "learning_rate": 1e-2, "prompts_per_step": 4,
                                   "mini_batch_size": 2, "num_steps": 3, "checkpoint_every_steps": 1,
                                   "max_checkpoints_to_keep": 5, **training}),
        rollout=RolloutConfig(max_prompt_tokens=8, max_new_tokens=5, seed=0),
        reward_manager=rewards.RewardManager([rewards.numeric_answer_reward(), length_fraction]),
        output_dir=output_dir,
    )


def numpy_tree(tree):
    return jax.tree.map(np.array, jax.device_get(tree))


def states(learner):
    """Both models' parameters and optimizer states and the key, as NumPy."""
    return numpy_tree({name: state._asdict() for name, state in learner.state.models.items()} | {"rng": learner.state.rng})


def same(a, b) -> bool:
    return all(np.array_equal(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True))


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """Three PPO steps (two of critic warm-up, beta 0.05, two mini-batches), a checkpoint after each."""
    folder = tmp_path_factory.mktemp("ppo") / "run"
    learner = make_learner(output_dir=folder)
    snapshots = [states(learner)]
    history = []
    for _ in range(3):
        history.append(learner.train_step())
        learner.train(learner.step)  # no step left to run: the checkpoint
        snapshots.append(states(learner))
    learner._recorder.wait()
    return {"learner": learner, "folder": folder, "snapshots": snapshots, "history": history}


# -- config ------------------------------------------------------------------------------------


def test_defaults_allow_one_completion_per_prompt():
    config = PPOConfig()
    assert (config.group_size, config.gamma, config.gae_lambda, config.advantage_estimator) == (1, 1.0, 0.95, "gae")
    assert PPOConfig.from_dict(config.to_dict()) == config
    with pytest.raises(ConfigError, match=r"^GRPOConfig.group_size = 1: must be >= 2$"):
        GRPOConfig(group_size=1)  # a group estimator still needs a group


@pytest.mark.parametrize(("field", "value", "rule"), [
    ("gamma", 1.5, "must be in [0, 1]"),
    ("gae_lambda", -0.1, "must be in [0, 1]"),
    ("value_clip", 0.0, "must be > 0 or None"),
    ("critic_learning_rate", 0.0, "must be > 0 or None"),
    ("critic_warmup_steps", -1, "must be >= 0"),
    ("advantage_estimator", "grpo", "unknown token_advantage_estimator 'grpo'"),
])  # fmt: skip
def test_bad_settings_fail_in_one_line_naming_the_field(field, value, rule):
    with pytest.raises(ConfigError) as error:
        PPOConfig(**{field: value})
    message = str(error.value)
    assert message.startswith(f"PPOConfig.{field} = {value!r}: ") and rule in message and "\n" not in message


def test_a_group_algorithm_asking_for_gae_is_told_it_needs_a_critic():
    with pytest.raises(ConfigError, match="needs a critic's values"):
        GRPOConfig(advantage_estimator="gae")


# -- the two models ------------------------------------------------------------------------------


def test_warm_up_trains_the_critic_alone_then_both(run):
    snaps, history = run["snapshots"], run["history"]
    for step in (1, 2):  # critic warm-up: the policy and its optimizer state stay as they were
        assert same(snaps[step]["policy"], snaps[0]["policy"])
        assert not same(snaps[step]["critic"]["params"], snaps[step - 1]["critic"]["params"])
        assert "train/loss" not in history[step - 1] and history[step - 1]["critic/updates"] == 2.0
    assert not same(snaps[3]["policy"]["params"], snaps[2]["policy"]["params"])
    assert history[2]["train/updates"] == 2.0 and history[2]["critic/updates"] == 2.0
    for m in history:
        assert np.isfinite(m["critic/loss"]) and 0.0 <= m["critic/clip_frac"] <= 1.0
        assert "critic/explained_variance" in m and "train/kl" not in m  # the KL is in the rewards, not the loss


def test_an_update_of_one_model_leaves_the_other_untouched(run):
    learner = make_learner(PPOConfig())
    example = learner.produce_examples(learner.supply().stream.next(4)).example
    (mini, _) = learner.layout.mini_batches(example)
    # both start from the policy's weights, in buffers of their own (an update donates them)
    assert not {x.unsafe_buffer_pointer() for x in jax.tree.leaves(learner.params)} & {
        x.unsafe_buffer_pointer() for x in jax.tree.leaves(learner.state.models["critic"].params)}

    def update(name):
        state, _ = learner.models[name].update(learner.state.models[name], mini)
        stage(learner, learner.state.with_model(name, state))

    before = states(learner)
    update("critic")  # the critic's gradient reaches only the critic ...
    after_critic = states(learner)
    assert same(after_critic["policy"], before["policy"]) and not same(after_critic["critic"], before["critic"])
    update("policy")  # ... and the policy's only the policy
    after_policy = states(learner)
    assert same(after_policy["critic"], after_critic["critic"]) and not same(after_policy["policy"], before["policy"])


def test_advantages_are_whitened_gae_over_rewards_with_the_kl_penalty(run):
    learner = run["learner"]
    groups = learner._score(learner._rollout_groups(learner.supply().stream.next(4)))
    example = learner._example_from_groups(groups)
    assert example.old_logp is not None and example.ref_logp is not None  # the KL penalty reads both
    mask = example.completion_mask
    np.testing.assert_allclose(example.values, learner.critic_values(example), **close())
    kl = np.asarray(example.old_logp) - np.asarray(example.ref_logp)  # k1
    rewards_ = token_rewards(groups.rewards, mask, kl=kl, beta=0.05)
    raw, returns = gae(rewards_, example.values, mask, gamma=1.0, lam=0.95)
    np.testing.assert_allclose(example.advantages, whiten(raw, mask), **close(atol=1e-5))
    np.testing.assert_allclose(example.returns, returns, **close(atol=1e-6))
    assert np.abs(kl * mask).max() > 0  # the penalty was not zero: the policy moved at step 3


def test_held_out_metrics_leave_the_training_key_stream_alone(run):
    learner = run["learner"]
    rng = np.array(learner.state.rng)
    metrics = learner.heldout_metrics(PROMPTS[:8])
    assert set(metrics) == {"eval/critic_explained_variance"} and np.isfinite(metrics["eval/critic_explained_variance"])
    np.testing.assert_array_equal(np.array(learner.state.rng), rng)


# -- checkpoints -------------------------------------------------------------------------------


def test_resume_restores_both_models_and_the_warm_up(run, tmp_path):
    folder = tmp_path / "run"
    shutil.copytree(run["folder"], folder)
    for step in ("2", "3"):  # as if killed after step 1's checkpoint, inside the warm-up
        shutil.rmtree(folder / "checkpoints" / step)
    learner = make_learner(output_dir=folder)
    assert learner.resume(log=lambda _: None) and learner.step == 1
    assert same(states(learner), run["snapshots"][1])  # both parameter trees, both optimizer states, the key
    for step in (2, 3):
        learner.train_step()
        assert same(states(learner), run["snapshots"][step]), f"step {step}"  # step 2 is still warm-up
    learner.close()


# -- LoRA: one frozen base for both models ------------------------------------------------------


@pytest.mark.e2e  # a whole LoRA learner with its critic; the LoRA critic's parts are unit-tested in the fast tier
def test_a_lora_critic_trains_adapters_and_head_over_the_policys_frozen_base():
    policy = add_adapters(Transformer(MODEL, rngs=nnx.Rngs(0)), rank=2, alpha=4.0)
    base_before = numpy_tree(nnx.to_pure_dict(nnx.state(policy, nnx.LoRAParam, nnx.Param)[1]))
    learner = make_learner(PPOConfig(critic_learning_rate=2e-2), policy=policy, num_steps=2)
    policy_part, critic = learner.models["policy"], learner.models["critic"]
    pointers = lambda tree: {x.unsafe_buffer_pointer() for x in jax.tree.leaves(tree)}  # noqa: E731
    assert pointers(critic.frozen) <= pointers(policy_part.frozen)  # no second copy of the base
    trained = jax.tree_util.tree_leaves_with_path(learner.state.models["critic"].params)
    names = {jax.tree_util.keystr(path) for path, _ in trained}
    assert all("lora_" in n or "_head" in n for n in names)  # adapters, the value and confidence heads
    assert any("value_head" in n for n in names) and any("confidence_head" in n for n in names)
    head_before = numpy_tree(learner.state.models["critic"].params["value_head"])
    for _ in range(2):
        learner.train_step()
    # the base is bit-identical after training, in both models (the critic's under "backbone")
    for frozen in (policy_part.frozen, critic.frozen["backbone"]):
        for path, value in jax.tree_util.tree_leaves_with_path(numpy_tree(frozen)):
            want = base_before
            for key in path:
                want = want[key.key]
            np.testing.assert_array_equal(value, want, err_msg=jax.tree_util.keystr(path))
    critic_params = learner.state.models["critic"].params
    assert not same(numpy_tree(critic_params["value_head"]), head_before)
    assert np.abs(np.asarray(critic_params["backbone"]["layers"]["mlp"]["up_proj"]["lora_b"])).max() > 0
    assert state_arrays(learner.state)["critic"]["params"] is critic_params  # adapters and head: no base


def test_environment_turn_rewards_go_on_each_turns_last_token(run):
    """Episodes: the environment's per-turn rewards join the task's reward as token rewards."""
    learner = run["learner"]
    groups = learner._score(learner._rollout_groups(learner.supply().stream.next(2)))
    t = groups.completion_mask.shape[1]
    episodes = tuple({"rewards": [0.5, -0.25], "turn_ends": [1, 3]} for _ in range(len(groups.rewards)))
    with_turns = dataclasses.replace(groups, row_fields={"episode": episodes})
    turns = learner._turn_rewards(with_turns)
    want = np.zeros((len(groups.rewards), t), np.float32)
    want[:, 1], want[:, 3] = 0.5, -0.25
    np.testing.assert_array_equal(turns, want)
    np.testing.assert_array_equal(learner._turn_rewards(groups), 0.0)  # no episodes: nothing added
    example = learner._example_from_groups(with_turns)
    mask = example.completion_mask
    kl = np.asarray(example.old_logp) - np.asarray(example.ref_logp)
    rewards_ = token_rewards(groups.rewards, mask, kl=kl, beta=0.05) + want * (np.asarray(mask) > 0)
    _, returns = gae(rewards_, example.values, mask, gamma=1.0, lam=0.95)
    np.testing.assert_allclose(example.returns, returns, **close(atol=1e-6))
