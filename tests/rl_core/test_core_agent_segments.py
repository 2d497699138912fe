"""Rewritten agent histories: every earlier segment trains as a row of its own with its episode's advantage,
and the group statistics count episodes, never segments (rl_core.episodes.segments)."""

import dataclasses

import jax
import numpy as np
import pytest
from flax import nnx

import rewards
import rl_models
from algo_grpo import GRPOConfig, GRPOLearner
from rl_core.config import RolloutConfig, TrainingConfig
from rl_core.data import Prompt
from rl_core.episodes.segments import Segments, expand
from rl_core.learner.groups import Groups, concat
from rl_core.testing import BagPolicy, make_groups
from rl_core.types import TrainExample
from tolerances import approx, close

TOK = rl_models.CharTokenizer()
PROMPTS = [Prompt(f"{a}+{b}=", {"answer": str(a + b)}) for a in range(1, 5) for b in range(1, 5)]
T = 6


def segments(episodes, prompt_width=4):
    """Earlier segments of the given rows: segment j has prompt tokens 40 + j (its last `j + 1` real),
    completion tokens 50 + j with the model's tokens at columns 0-1 and 4 and template tokens at 2-3."""
    s = len(episodes)
    prompt_tokens = np.zeros((s, prompt_width), np.int32)
    prompt_mask = np.zeros((s, prompt_width), np.float32)
    for j in range(s):
        prompt_tokens[j, prompt_width - j - 1:] = 40 + j
        prompt_mask[j, prompt_width - j - 1:] = 1.0
    mask = np.tile(np.asarray([1, 1, 0, 0, 1, 0], np.float32), (s, 1))
    return Segments(episode=np.asarray(episodes, np.int64), prompt_tokens=prompt_tokens, prompt_mask=prompt_mask,
                    completion_tokens=(50 + np.arange(s)[:, None] + np.zeros((1, T), np.int32)).astype(np.int32),
                    completion_mask=mask, sampler_logp=-0.5 * mask, token_version=np.full((s, T), 3, np.int32))


def test_expand_appends_each_segment_with_its_episode_advantage_then_empty_rows():
    adv = np.asarray([1.5, -0.5, -0.5, -0.5], np.float32)
    example = TrainExample(np.full((4, 3), 7, np.int32), np.ones((4, 3), np.float32), np.ones((4, T), np.int32),
                           np.ones((4, T), np.float32), adv, sampler_logp=np.full((4, T), -1.0, np.float32),
                           old_logp=np.full((4, T), -2.0, np.float32))
    out = expand(example, segments([0, 0, 2]), 8, pad_id=0)
    # rows 0-3 the episodes, 4-6 the segments of episodes 0, 0 and 2, row 7 an empty row
    np.testing.assert_array_equal(out.advantages, [1.5, -0.5, -0.5, -0.5, 1.5, 1.5, -0.5, 0.0])
    assert out.prompt_tokens.shape == (8, 4)  # the wider prompts (4) decide; the rows' re-padded on the left
    np.testing.assert_array_equal(out.prompt_tokens[0], [0, 7, 7, 7])
    np.testing.assert_array_equal(out.prompt_mask[0], [0, 1, 1, 1])
    np.testing.assert_array_equal(out.prompt_tokens[5], [0, 0, 41, 41])
    np.testing.assert_array_equal(out.prompt_tokens[7], out.prompt_tokens[0])  # an empty row repeats row 0's prompt
    np.testing.assert_array_equal(out.completion_mask[4], [1, 1, 0, 0, 1, 0])  # the model's tokens only
    np.testing.assert_array_equal(out.completion_mask[7], np.zeros(T))  # nothing of the empty row in the loss
    np.testing.assert_array_equal(out.completion_tokens[6], [52] * T)
    np.testing.assert_array_equal(out.sampler_logp[4], [-0.5, -0.5, 0, 0, -0.5, 0])
    assert np.isnan(out.old_logp[4:7]).all() and (out.old_logp[:4] == -2).all() and (out.old_logp[7] == 0).all()
    assert expand(example, None, 8, pad_id=0) is example  # no rewritten history: the batch unchanged
    with pytest.raises(ValueError, match="per token"):
        expand(example._replace(advantages=np.zeros((4, T), np.float32)), segments([1]), 8, pad_id=0)


def groups_with_segments():
    tokens = np.arange(8 * T, dtype=np.int32).reshape(8, T) % 20 + 3
    groups = make_groups(PROMPTS[:2], [1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 1.0], group_size=4,
                         completion_tokens=tokens, lengths=[3, 4, 2, 5, 3, 3, 4, 2])
    # episode 0 rewrote its history twice (3 segments), episode 2 and episode 7 once
    return dataclasses.replace(groups, segments=segments([0, 0, 2, 7]))


def test_groups_keep_their_segments_through_select_concat_and_json():
    groups = groups_with_segments()
    second = groups.select([1, 0])  # group 1 first: episodes 4-7 become rows 0-3
    assert second.segments.episode.tolist() == [3, 4, 4, 6]
    assert second.segments.completion_tokens[:, 0].tolist() == [53, 50, 51, 52]  # each kept with its episode
    both = concat([groups.select([1]), groups.select([0])], pad_id=0)
    assert both.segments.episode.tolist() == [3, 4, 4, 6]
    assert groups.select([1]).segments.episode.tolist() == [3]
    back = Groups.from_json(groups.to_json())
    for name in ("episode", "prompt_tokens", "prompt_mask", "completion_tokens", "completion_mask", "sampler_logp",
                 "token_version"):
        np.testing.assert_array_equal(getattr(back.segments, name), getattr(groups.segments, name))


@pytest.fixture(scope="module")
def learner():
    return GRPOLearner(
        GRPOConfig(group_size=4, beta=0.0), policy=BagPolicy(TOK.vocab_size, rngs=nnx.Rngs(0)), tokenizer=TOK,
        train_data=PROMPTS, training=TrainingConfig(prompts_per_step=2, optimizer="sgd", micro_batch_size=4),
        rollout=RolloutConfig(max_new_tokens=T, max_prompt_tokens=8),
        reward_manager=rewards.RewardManager([rewards.numeric_answer_reward()]))


def test_the_learner_trains_segments_with_their_episode_advantage_normalised_over_episodes(learner):
    groups = groups_with_segments()
    example = learner._example_from_groups(groups)
    # GRPO over the episodes: group 0 rewards (1, 0, 0, 0): mean 0.25, std (ddof 1) sqrt(0.75 / 3) = 0.5,
    # A = (1.5, -0.5, -0.5, -0.5); group 1 (1, 1, 0, 1): mean 0.75, std 0.5, A = (0.5, 0.5, -1.5, 0.5).
    # Counting the segments as members (episode 0's reward thrice...) would give group 0 a mean of 3/7.
    episodes = [1.5, -0.5, -0.5, -0.5, 0.5, 0.5, -1.5, 0.5]
    # 8 episodes + 4 segments = 12 rows: three micro-batches of 4 (the step's 8 rows were two)
    assert example.batch_size == learner.layout.rows_for(12) == 12
    np.testing.assert_allclose(example.advantages, [*episodes, 1.5, 1.5, -0.5, 0.5], **close(atol=1e-5))
    np.testing.assert_array_equal(example.completion_mask[8], [1, 1, 0, 0, 1, 0])
    batch = learner._examples_from(groups)
    assert batch.metrics["advantages/mean"] == approx(0.0, abs=1e-6)  # the episodes' advantages alone
    assert batch.metrics["advantages/std"] == approx(float(np.std(episodes)), abs=1e-5)
    assert batch.metrics["episodes/earlier_segments"] == 4.0
    assert [s["advantage"] for s in batch.samples] == approx(episodes, abs=1e-5)  # one sample per episode
    before = jax.tree.map(np.asarray, learner.params)  # the update donates the old buffers
    stats = learner.update_models(example)["policy"]  # the update takes the 12 rows as three micro-batches
    assert len(stats) == 1 and bool(stats[0]["finite"]) and np.isfinite(float(stats[0]["loss"]))
    moved = max(float(np.abs(np.asarray(a) - np.asarray(b)).max())
                for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(learner.params), strict=True))
    assert moved > 0


def test_a_rewritten_segment_alone_moves_the_weights(learner):
    """The segments' rows are really in the loss: episodes with every token out of the loss and one
    segment with an advantage still change the parameters."""
    groups = groups_with_segments()
    groups = dataclasses.replace(groups, completion_mask=np.zeros_like(groups.completion_mask),
                                 segments=groups.segments.select([0]))
    example = learner._example_from_groups(groups)
    assert example.batch_size == 12 and example.advantages[8:10].tolist() == approx([1.5, 1.5], abs=1e-5)
    before = jax.tree.map(np.asarray, learner.params)  # the update donates the old buffers
    learner.update_models(example)
    assert max(float(np.abs(np.asarray(a) - np.asarray(b)).max())
               for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(learner.params), strict=True)) > 0


def test_segments_carried_to_a_later_step_keep_the_log_probs_of_the_policy_that_sampled_them(learner):
    """DAPO records a carried round's behaviour log-probs at collection: the segments' rows too, and
    the update keeps them (a pass at training time would take the later weights' instead)."""
    groups = learner._record_behaviour_logprobs(groups_with_segments())
    seg = groups.segments
    assert seg.old_logp.shape == (4, T) and np.isfinite(seg.old_logp).all()
    np.testing.assert_array_equal(Groups.from_json(groups.to_json()).segments.old_logp, seg.old_logp)
    example = learner._to_example(groups, learner._compute_advantages(groups))
    expanded = expand(example, seg, 12, pad_id=0)
    np.testing.assert_array_equal(expanded.old_logp[8:12], seg.old_logp)  # kept, not NaN: no pass reruns them
    direct = learner._behaviour_logprobs(expanded.prompt_tokens[8:12], expanded.prompt_mask[8:12],
                                         expanded.completion_tokens[8:12],
                                         completion_mask=expanded.completion_mask[8:12])
    np.testing.assert_allclose(seg.old_logp * seg.completion_mask, np.asarray(direct) * seg.completion_mask,
                               **close(atol=1e-5))
    assert (seg.old_logp[seg.completion_mask > 0] < 0).all()
