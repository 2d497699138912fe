"""DAPO dynamic sampling against a scripted rollout.

`ScriptedDAPO._rollout_groups` replays a script: one list of group kinds per
generation round, I = informative (rewards [1, 0]), U = all ones, Z = all
zeros, L = all wrong with the second completion overlong (length L_max, so
DAPO's own overlong penalty gives it -1: totals [0, -1]). Every group gets a serial id written into its completion tokens and
texts, so a batch shows exactly which groups were kept; the rewards come from
the real scoring path (reward manager over the texts).
"""

import json
import math

import jax
import numpy as np
import pytest
from flax import nnx

import rewards
import rl_models
from algo_dapo import DAPOConfig, DAPOLearner, DynamicSamplingError
from rl_core.config import RolloutConfig, TrainingConfig
from rl_core.data import Prompt
from rl_core import Groups
from rl_core.learner import carry_from_json, carry_to_json
from rl_core.correction_config import RolloutCorrection
from rl_core.testing import tree_max_abs_diff
from rl_core.testing import BagPolicy, make_groups, stage
from tolerances import approx, close

OFF = RolloutCorrection(mode="off")

I, U, Z, L = "I", "U", "Z", "L"  # noqa: E741 - the script reads as a table of kinds
REWARDS = {I: (1.0, 0.0), U: (1.0, 1.0), Z: (0.0, 0.0), L: (0.0, 0.0)}
G = 2
T = 4  # L_max; the default L_cache is max(1, 4 // 5) = 1, so length 4 gets -1 and 3 gets 0
LENGTHS = {I: (2, 3), U: (2, 3), Z: (2, 3), L: (2, 4)}
FIRST_ID_TOKEN = 10  # group id k is written as token 10 + k
# GRPO advantage of [1, 0]: mean 0.5, std(ddof=1) = sqrt(0.5); 0.5 / (sqrt(0.5) + 1e-6) = 0.7071058
A = 0.5 / (math.sqrt(0.5) + 1e-6)


def scripted_reward(prompts, completions, **_):
    """The reward written in the completion text '<group id>:<reward>'."""
    return [float(c.split(":")[1]) for c in completions]


class ScriptedDAPO(DAPOLearner):
    def __init__(self, config, *, script, first_id=0, **kwargs):
        super().__init__(config, **kwargs)
        self.script = list(script)
        self.rounds: list[list[str]] = []  # prompt texts of every generation round
        self.next_id = first_id
        self.batches = []

    def _rollout_groups(self, prompts, draw=None):
        assert self.script, "more generation rounds than scripted"
        kinds = self.script.pop(0)
        assert len(kinds) == len(prompts)
        self.rounds.append([p.text for p in prompts])
        ids = list(range(self.next_id, self.next_id + len(kinds)))
        self.next_id += len(kinds)
        return make_groups(
            prompts,
            [0.0] * (G * len(kinds)),  # filled in by score()
            group_size=G,
            completion_tokens=np.repeat(FIRST_ID_TOKEN + np.asarray(ids), G)[:, None] * np.ones((1, T), np.int64),
            lengths=[n for kind in kinds for n in LENGTHS[kind]],
            texts=[f"{gid}:{r:g}" for gid, kind in zip(ids, kinds, strict=True) for r in REWARDS[kind]],
        )

    def _examples_from(self, groups):
        batch = super()._examples_from(groups)
        self.batches.append(batch)
        return batch


def make(script, *, first_id=0, **config):
    tok = rl_models.CharTokenizer()
    return ScriptedDAPO(
        # the scripted groups carry made-up sampler log-probs (-1 a token): no rollout correction
        DAPOConfig(group_size=G, max_gen_batches=config.pop("max_gen_batches", 3), rollout_correction=OFF, **config),
        script=script,
        first_id=first_id,
        policy=BagPolicy(tok.vocab_size, rngs=nnx.Rngs(0)),
        tokenizer=tok,
        train_data=[Prompt(f"q{i}") for i in range(8)],
        training=TrainingConfig(prompts_per_step=2, optimizer="sgd", learning_rate=0.5, max_grad_norm=None),
        rollout=RolloutConfig(max_new_tokens=T),
        reward_manager=rewards.RewardManager([scripted_reward]),
    )


def group_ids(batch) -> list[int]:
    return [int(t) - FIRST_ID_TOKEN for t in np.asarray(batch.example.completion_tokens)[::G, 0]]


def live_groups(batch) -> list[bool]:
    """Per group: does any row have a token in the loss?"""
    return list(np.asarray(batch.example.completion_mask).reshape(-1, G * T).sum(axis=1) > 0)


def dapo_metrics(metrics) -> dict[str, float]:
    return {k: v for k, v in metrics.items() if k.startswith("dapo/") or k == "groups/uniform_frac"}


def test_rounds_kept_groups_and_surplus_carried_to_the_next_step():
    learner = make(script=[[I, U], [I, I], [U, I]])

    # Step 1. Round 1 [I(0), U(1)] keeps 0; round 2 [I(2), I(3)] keeps 2 and 3: 3 >= 2 groups.
    # The batch is [0, 2]; 3 is carried over. 4 groups sampled, 1 uniform.
    m1 = learner.train_step()
    batch = learner.batches[-1]
    assert len(learner.rounds) == 2
    assert group_ids(batch) == [0, 2] and live_groups(batch) == [True, True]
    assert dapo_metrics(m1) == {
        "dapo/gen_rounds": 2.0,
        "dapo/groups_sampled": 4.0,
        "dapo/groups_kept": 2.0,
        "dapo/groups_carried_in": 0.0,
        "dapo/surplus_carried": 1.0,
        "groups/uniform_frac": 0.25,
    }
    # Round 2 drew new prompts from the stream: 2 for the step + 2 more.
    assert learner.state.data_position == 4
    assert len({*learner.rounds[0], *learner.rounds[1]}) == 4
    # kept groups keep their own prompts: group 0 is round 1's first, group 2 round 2's first
    assert [s["prompt"] for s in batch.samples[::G]] == [learner.rounds[0][0], learner.rounds[1][0]]
    np.testing.assert_allclose(batch.example.advantages, [A, -A, A, -A], **close(atol=1e-6))
    assert math.isfinite(m1["train/loss"])
    carry = json.loads(json.dumps(carry_to_json(learner.state.carry)))["carry"]
    assert carry["texts"] == ["3:1", "3:0"] and carry["rewards"] == [1.0, 0.0]

    # Step 2. The carried group 3 comes first; round 1 [U(4), I(5)] keeps 5: done in one round.
    m2 = learner.train_step()
    batch = learner.batches[-1]
    assert group_ids(batch) == [3, 5]
    assert dapo_metrics(m2) == {
        "dapo/gen_rounds": 1.0,
        "dapo/groups_sampled": 2.0,
        "dapo/groups_kept": 2.0,
        "dapo/groups_carried_in": 1.0,
        "dapo/surplus_carried": 0.0,
        "groups/uniform_frac": 0.5,
    }
    assert carry_to_json(learner.state.carry) == {"carry": None}
    assert learner.script == [] and len(learner.rounds) == 3


def test_reward_metrics_describe_the_groups_trained_on():
    learner = make(script=[[I, U], [I, I]])
    m = learner.train_step()
    # kept groups 0 and 2 score [1, 0] each: mean 0.5 (all four sampled groups would give 0.625)
    assert m["rewards/scripted_reward/mean"] == m["rewards/total/mean"] == 0.5
    assert m["rewards/overlong_penalty/mean"] == 0.0


def test_filter_judges_groups_by_correctness_not_by_shaped_totals():
    # L is all wrong; its overlong completion makes the totals [0, -1], which differ.
    learner = make(script=[[L, I], [I, U]])
    m = learner.train_step()
    assert group_ids(learner.batches[-1]) == [1, 2]  # L (group 0) dropped, like U (group 3)
    assert m["dapo/groups_sampled"] == 4.0 and m["groups/uniform_frac"] == 0.5

    by_total = make(script=[[L, I]], filter_reward="total")
    m = by_total.train_step()
    assert group_ids(by_total.batches[-1]) == [0, 1]  # kept, and trained on length alone
    np.testing.assert_allclose(by_total.batches[-1].example.advantages[:2], [A, -A], **close(atol=1e-6))


def test_unknown_filter_reward_is_rejected():
    with pytest.raises(ValueError, match=r"filter_reward = 'acc'.*\['total', 'scripted_reward', 'overlong_penalty'\]"):
        make(script=[], filter_reward="acc")


def test_carried_rows_keep_the_behaviour_logprobs_of_the_policy_that_sampled_them():
    learner = make(script=[[I, U], [I, I], [U, I]])
    learner.train_step()  # group 3 carried over, sampled by the step-1 policy
    carry = json.loads(json.dumps(carry_to_json(learner.state.carry)))["carry"]
    recorded = np.asarray(carry["old_logp"], np.float32)
    assert recorded.shape == (G, T) and np.isfinite(recorded).all()

    resumed = make(script=[[U, I]], first_id=4)
    # the parameters after step 1's update, and the carry as a checkpoint holds it
    stage(resumed, params=learner.params, carry=carry_from_json({"carry": carry}, Groups))
    example = resumed.produce_examples(resumed.supply().stream.next(2)).example
    assert group_ids(resumed.batches[-1]) == [3, 5]
    np.testing.assert_array_equal(np.asarray(example.old_logp)[:G], recorded)  # kept, not recomputed
    new, _ = resumed._logprob_pass(resumed.params, example)
    mask = np.asarray(example.completion_mask) > 0
    ratio = np.exp(np.asarray(new) - np.asarray(example.old_logp))
    # the policy moved since the carried rows were sampled; fresh rows are on-policy
    assert np.abs(ratio[:G][mask[:G]] - 1).min() > 1e-4  # rounding alone gives ~1e-7
    np.testing.assert_allclose(ratio[G:][mask[G:]], 1.0, **close(atol=1e-5))
    (stats,) = resumed.update_models(example)["policy"]
    assert stats["minima"]["train/ratio_min"] == approx(ratio[mask].min(), rel=1e-5)
    assert stats["maxima"]["train/ratio_max"] == approx(ratio[mask].max(), rel=1e-5)


def test_carry_over_survives_a_json_checkpoint():
    first = make(script=[[I, U], [I, I]])
    first.train_step()
    state = json.loads(json.dumps(carry_to_json(first.state.carry)))  # as written in a checkpoint's metadata

    resumed = make(script=[[U, I]], first_id=100)
    stage(resumed, carry=carry_from_json(state, Groups))
    batch = resumed.produce_examples(resumed.supply().stream.next(2))
    # group 3 from the first learner, then group 101 (100 was uniform)
    assert group_ids(batch) == [3, 101]
    assert batch.metrics["dapo/groups_carried_in"] == 1.0 and batch.metrics["dapo/gen_rounds"] == 1.0
    # the carried rows arrive intact: lengths [2, 3] -> masks, rewards [1, 0] -> advantages
    np.testing.assert_array_equal(np.asarray(batch.example.completion_mask)[:2], [[1, 1, 0, 0], [1, 1, 1, 0]])
    np.testing.assert_array_equal(np.asarray(batch.example.sampler_logp)[:2], [[-1, -1, 0, 0], [-1, -1, -1, 0]])
    np.testing.assert_allclose(batch.example.advantages, [A, -A, A, -A], **close(atol=1e-6))
    assert [s["completion"] for s in batch.samples[:2]] == ["3:1", "3:0"]

    stage(resumed, carry=carry_from_json({"carry": None}, Groups))
    assert carry_to_json(resumed.state.carry) == {"carry": None}


def test_partial_at_the_cap_fills_the_batch_with_masked_rows():
    # step 1: 1 informative group (4) after the cap of 3 rounds; step 2: none at all
    script = [[U, Z], [Z, U], [I, U], [U, U], [Z, Z], [U, Z]]
    learner = make(script=script)
    before = jax.tree.map(np.array, learner.params)
    m1 = learner.train_step()
    batch = learner.batches[-1]
    assert len(learner.rounds) == 3
    # group 4, then one filler group whose rows are all masked out
    assert group_ids(batch)[0] == 4 and live_groups(batch) == [True, False]
    assert np.all(np.asarray(batch.example.completion_mask)[G:] == 0)
    assert dapo_metrics(m1) == {
        "dapo/gen_rounds": 3.0,
        "dapo/groups_sampled": 6.0,
        "dapo/groups_kept": 1.0,
        "dapo/groups_carried_in": 0.0,
        "dapo/surplus_carried": 0.0,
        "groups/uniform_frac": 5 / 6,
    }
    assert math.isfinite(m1["train/loss"]) and m1["train/skipped_updates"] == 0
    after_1 = jax.tree.map(np.array, learner.params)
    assert tree_max_abs_diff(before, after_1) > 0  # the informative group trained
    assert carry_to_json(learner.state.carry) == {"carry": None}

    m2 = learner.train_step()
    batch = learner.batches[-1]
    assert live_groups(batch) == [False, False]
    assert m2["dapo/groups_kept"] == 0.0 and m2["groups/uniform_frac"] == 1.0
    # nothing in the loss: loss 0, no update, nothing skipped
    assert m2["train/loss"] == 0.0 and m2["train/skipped_updates"] == 0
    assert tree_max_abs_diff(after_1, jax.tree.map(np.array, learner.params)) == 0


def test_a_partial_batch_reports_and_samples_only_the_groups_trained_on():
    """Round 3 is [U(4), I(5)]: group 5 is kept and the filler is a masked copy of group 4
    (rewards 1, 1). Over the batch, rewards would be (1 + 0 + 1 + 1) / 4 = 0.75; over the
    one group in the loss they are 0.5, its advantages +-A (std A, not A / sqrt 2)."""
    learner = make(script=[[U, Z], [Z, U], [U, I]])
    m = learner.train_step()
    batch = learner.batches[-1]
    assert group_ids(batch) == [5, 4] and live_groups(batch) == [True, False]
    assert m["dapo/groups_kept"] == 1.0
    assert m["rewards/total/mean"] == m["rewards/scripted_reward/mean"] == 0.5
    assert m["rewards/scripted_reward/frac_positive"] == 0.5
    assert m["advantages/std"] == approx(A, abs=1e-6)
    assert [(s["completion"], s["reward"]) for s in batch.samples] == [("5:1", 1.0), ("5:0", 0.0)]
    assert [s["advantage"] for s in batch.samples] == approx([A, -A], abs=1e-6)


def test_raise_at_the_cap():
    learner = make(script=[[U, Z], [I, U]], max_gen_batches=2, on_max_gen_batches="raise")
    with pytest.raises(DynamicSamplingError) as info:
        learner.train_step()
    message = str(info.value)
    assert message.startswith(
        "step 1: only 1 of 2 groups were informative after max_gen_batches=2 generation rounds "
        "(3 of 4 sampled groups had equal rewards)."
    )
    assert "on_max_gen_batches='partial'" in message and "max_gen_batches" in message
    assert learner.step == 0 and len(learner.rounds) == 2


def test_without_dynamic_sampling_uniform_groups_stay():
    learner = make(script=[[U, I]], dynamic_sampling=False)
    batch = learner.produce_examples(learner.supply().stream.next(2))
    assert group_ids(batch) == [0, 1] and len(learner.rounds) == 1
    np.testing.assert_array_equal(np.asarray(batch.example.advantages)[:2], [0.0, 0.0])
    assert batch.metrics["groups/uniform_frac"] == 0.5
    assert not any(k.startswith("dapo/") for k in batch.metrics)
