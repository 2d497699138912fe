"""The GRPO pipeline skips work nobody needs, and micro-batching is exact.

Uses the toy `BagPolicy` (a real NNX policy honouring masks and the KV cache)
so that the many small programs compile quickly.
"""


import jax
import numpy as np
import pytest
from flax import nnx

import rewards
import rl_models
from algo_dapo import DAPOConfig, DAPOLearner
from algo_dr_grpo import DrGRPOConfig, DrGRPOLearner
from algo_grpo import GRPOConfig, GRPOLearner
from rl_core.config import RolloutConfig, TrainingConfig
from rl_core.data import Prompt
from rl_core.correction_config import RolloutCorrection
from rl_core.testing import BagPolicy, make_groups, tree_max_abs_diff
from tolerances import approx, bound, close

TOK = rl_models.CharTokenizer()
PROMPTS = [Prompt(f"{a}+{b}=", {"answer": str(a + b)}) for a in range(1, 5) for b in range(1, 5)]


def digit_fraction(prompts, completions, **_):
    """Shaping reward: the share of digits in the completion (varies even for an untrained policy)."""
    return [sum(c.isdigit() for c in text) / max(len(text), 1) for text in completions]


def _learner(cls, config, *, micro_batch_size=None, **kwargs):
    return cls(
        config,
        policy=BagPolicy(TOK.vocab_size, rngs=nnx.Rngs(0)),
        tokenizer=TOK,
        train_data=PROMPTS,
        training=TrainingConfig(
            prompts_per_step=2,
            optimizer="sgd",
            learning_rate=1.0,
            max_grad_norm=None,
            micro_batch_size=micro_batch_size,
        ),
        rollout=RolloutConfig(max_new_tokens=4, max_prompt_tokens=8),
        reward_manager=rewards.RewardManager([rewards.numeric_answer_reward(), digit_fraction]),
        **kwargs,
    )


# -- the reference path only when beta != 0, the old policy only when num_iterations > 1 ---


class CountingGRPO(GRPOLearner):
    """Counts calls of the reference log-prob step (and nothing else is changed)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.reference_calls = 0

    def _reference_logprobs(self, example):
        self.reference_calls += 1
        return super()._reference_logprobs(example)


def test_beta_zero_never_runs_the_reference_and_one_pass_no_old_policy():
    learner = _learner(CountingGRPO, GRPOConfig(group_size=2, beta=0.0, num_iterations=1))
    assert learner._ref_params is None  # no reference copy of the parameters in memory
    metrics = [learner.train_step() for _ in range(2)]
    assert learner.reference_calls == 0
    assert all("train/kl" not in m for m in metrics)
    example = learner.produce_examples(learner.supply().stream.next(2)).example
    assert example.old_logp is None and example.ref_logp is None
    assert learner.reference_calls == 0


def test_beta_positive_runs_the_reference_once_per_step_and_two_passes_compute_old_logp():
    learner = _learner(fixed_batch(CountingGRPO), GRPOConfig(group_size=2, beta=0.04, num_iterations=2))
    assert learner._ref_params is not None
    m = learner.train_step()
    # once per step, not once per pass
    assert learner.reference_calls == 1
    assert m["train/updates"] == 2.0 and np.isfinite(m["train/kl"])
    example = learner.produce_examples(learner.supply().stream.next(2)).example
    assert learner.reference_calls == 2
    assert example.old_logp is not None and example.old_logp.shape == example.completion_tokens.shape
    # the old policy is the current one (nothing trained since): its own log-probs
    current, _ = learner._logprob_pass(learner.params, example)
    np.testing.assert_allclose(example.old_logp, current, **close(rtol=1e-6, atol=1e-6))
    # the reference is the initial policy, which one step of SGD moved away from
    assert example.ref_logp is not None and not np.allclose(example.ref_logp, current, **close(rtol=1e-5, atol=1e-6))


# -- micro-batching: sizes 1, 2 and full give the same step ------------------------------

# Two groups of G = 2, T = 4; lengths differ so that every aggregation mode weighs
# rows differently; rewards [1, 0] and [0, 3] give nonzero advantages everywhere.
LENGTHS = [4, 2, 1, 3]
FIXED = make_groups(
    [Prompt("a"), Prompt("b")],
    [1.0, 0.0, 0.0, 3.0],
    group_size=2,
    completion_tokens=np.asarray([[10, 11, 12, 2], [13, 2, 0, 0], [2, 0, 0, 0], [14, 15, 2, 0]]),
    lengths=LENGTHS,
)


def fixed_batch(cls):
    """`cls` with group sampling replaced by the fixed groups above."""

    class Fixed(cls):
        _draws_on_scores = True  # its own `_sample_groups`: the collection runs whole

        def _sample_groups(self, prompts, supply, draw=None):
            return FIXED, supply

    return Fixed


# One config per aggregation mode used by the three algorithms. GRPO's beta is set to 0:
# at the first step the reference equals the policy, so the k3 term and its gradient are 0.
# FIXED's sampler log-probs are made up (-1 a token): no rollout correction.
OFF = RolloutCorrection(mode="off")
MODES = {
    "seq-mean-token-mean": (GRPOLearner, GRPOConfig(group_size=2, beta=0.0, rollout_correction=OFF)),
    "seq-mean-token-sum-norm": (DrGRPOLearner, DrGRPOConfig(group_size=2, rollout_correction=OFF)),
    "token-mean": (DAPOLearner, DAPOConfig(group_size=2, rollout_correction=OFF)),
}


class OneStepUpdates(dict):
    """(mode, micro_batch_size) -> (parameter change after one SGD step with lr 1 = -grad, loss),
    each learner built and stepped on first use: a tier runs only the learners its tests ask for."""

    def __missing__(self, key):
        mode, micro = key
        cls, config = MODES[mode]
        assert config.loss_agg_mode == mode
        learner = _learner(fixed_batch(cls), config, micro_batch_size=micro)
        assert learner.layout.num_micro_batches == {1: 4, 2: 2, None: 1}[micro]
        before = jax.tree.map(np.array, learner.params)
        metrics = learner.train_step()
        after = jax.tree.map(np.array, learner.params)
        self[key] = (jax.tree.map(lambda a, b: a - b, after, before), metrics["train/loss"])
        return self[key]


@pytest.fixture(scope="module")
def one_step_updates():
    return OneStepUpdates()


# two more learners per mode: one mode in the fast tier, the others in the e2e tier (the pure
# loss-invariance sweep, tests/algos/test_algo_loss_invariance.py, covers every mode in the fast tier)
@pytest.mark.parametrize("mode", [m if m == "seq-mean-token-sum-norm" else pytest.param(m, marks=pytest.mark.e2e)
                                  for m in MODES])
def test_micro_batch_sizes_give_the_same_update(one_step_updates, mode):
    full, full_loss = one_step_updates[mode, None]
    assert tree_max_abs_diff(full, jax.tree.map(np.zeros_like, full)) > 1e-4  # a real update
    for micro in (1, 2):
        delta, loss = one_step_updates[mode, micro]
        assert tree_max_abs_diff(delta, full) < bound(1e-5), f"{mode}: micro_batch_size={micro} differs"
        assert loss == approx(full_loss, rel=1e-6, abs=1e-6)


def test_the_modes_really_differ(one_step_updates):
    # Guards the test above against a mode that is silently ignored.
    deltas = [one_step_updates[mode, None][0] for mode in MODES]
    for i in range(len(deltas)):
        for j in range(i + 1, len(deltas)):
            assert tree_max_abs_diff(deltas[i], deltas[j]) > 1e-4


def test_loss_at_ratio_one_is_minus_the_aggregated_advantage(one_step_updates):
    # With one pass the ratio is 1 in value, so the policy loss per token is -A.
    # GRPO advantages: [1, 0]: mean 0.5, std(ddof=1) sqrt(0.5): +-a, a = 0.5 / (0.7071068 + 1e-6) = 0.7071058;
    # [0, 3]: mean 1.5, std 1.5 * sqrt(2): -+b, b = 1.5 / (2.1213203 + 1e-6) = 0.7071065.
    # Dr. GRPO advantages (no std): [0.5, -0.5, -1.5, 1.5]. Lengths [4, 2, 1, 3], L_max = 4.
    # seq-mean-token-mean: each row's token mean is -A; advantages sum to 0 within a group -> 0.
    assert one_step_updates["seq-mean-token-mean", None][1] == approx(0.0, abs=1e-6)
    # seq-mean-token-sum-norm: -(0.5*4 - 0.5*2 - 1.5*1 + 1.5*3) / L_max / 4 rows = -4 / 16 = -0.25
    assert one_step_updates["seq-mean-token-sum-norm", None][1] == approx(-0.25, abs=1e-6)
    # token-mean: -(4a - 2a - 1b + 3b) / (4 + 2 + 1 + 3) = -(2a + 2b) / 10 = -0.2828424
    assert one_step_updates["token-mean", None][1] == approx(-0.2828424, abs=1e-6)


# -- the loaded weights stay resident only when the reference needs them ---------------


def _grpo(policy, beta):
    return GRPOLearner(
        GRPOConfig(group_size=2, beta=beta), policy=policy, tokenizer=TOK, train_data=PROMPTS,
        training=TrainingConfig(prompts_per_step=2), rollout=RolloutConfig(max_new_tokens=4, max_prompt_tokens=8),
        reward_manager=rewards.RewardManager([rewards.numeric_answer_reward()]),
    )


def test_with_beta_0_the_learner_keeps_nothing_of_the_loaded_weights():
    """The learner trains float32 copies; with beta = 0 nothing it holds points at the policy's
    own arrays, so dropping the policy frees them (the trainer drops it once the learner is
    built: a 7B bfloat16 model is 14 GiB per replica)."""
    import gc
    import weakref

    policy = BagPolicy(TOK.vocab_size, rngs=nnx.Rngs(0))
    weights = [weakref.ref(x) for x in jax.tree.leaves(nnx.state(policy, nnx.Param))]
    learner = _grpo(policy, beta=0.0)
    del policy
    gc.collect()
    assert [r() for r in weights] == [None] * len(weights)
    assert learner._ref_params is None


def test_with_beta_the_reference_is_the_loaded_weights_not_a_copy():
    policy = BagPolicy(TOK.vocab_size, rngs=nnx.Rngs(0))
    learner = _grpo(policy, beta=0.04)
    pointers = lambda tree: [x.unsafe_buffer_pointer() for x in jax.tree.leaves(tree)]  # noqa: E731
    assert pointers(learner._ref_params) == pointers(nnx.state(policy, nnx.Param))


# -- prompt sharing: each group's prompt run once changes no number ----------------------


def test_sharing_each_groups_prompt_changes_no_logprob_and_no_update():
    """training.share_prompts (the default) against every row running its own prompt, on a
    real transformer: behaviour and reference log-probs, then two passes of SGD."""
    out = {}
    for share in (True, False):
        learner = fixed_batch(GRPOLearner)(
            GRPOConfig(group_size=2, beta=0.04, num_iterations=2, rollout_correction=OFF),
            policy=rl_models.Transformer(rl_models.TransformerConfig.tiny(TOK.vocab_size), rngs=nnx.Rngs(0)),
            tokenizer=TOK,
            train_data=PROMPTS,
            training=TrainingConfig(prompts_per_step=2, optimizer="sgd", learning_rate=1.0, max_grad_norm=None,
                                    share_prompts=share),
            rollout=RolloutConfig(max_new_tokens=4, max_prompt_tokens=8),
            reward_manager=rewards.RewardManager([rewards.numeric_answer_reward(), digit_fraction]),
        )
        example = learner.produce_examples(learner.supply().stream.next(2)).example
        shared = learner.layout.shared_prompts(example.prompt_tokens, example.prompt_mask)
        assert (shared is not None) == share
        before = jax.tree.map(np.array, learner.params)
        learner.update_models(example)
        delta = jax.tree.map(lambda a, b: np.asarray(a) - b, learner.params, before)
        out[share] = (example, delta)
    (shared_example, shared_delta), (rows_example, rows_delta) = out[True], out[False]
    np.testing.assert_allclose(shared_example.old_logp, rows_example.old_logp, **close(atol=1e-5))
    np.testing.assert_allclose(shared_example.ref_logp, rows_example.ref_logp, **close(atol=1e-5))
    scale = tree_max_abs_diff(shared_delta, jax.tree.map(np.zeros_like, shared_delta))
    assert scale > 1e-3  # a real update (the largest entry moves by about 14 at learning rate 1)
    assert tree_max_abs_diff(shared_delta, rows_delta) < bound(1e-5) * scale  # float32 round-off


# -- the reward audit's streaks are the learner's state --------------------------------------


def test_the_reward_audits_streaks_are_in_the_state_and_survive_a_resume(tmp_path):
    """After each step the state holds the audit's streaks; a checkpoint keeps them, and a learner
    resumed from it with a fresh auditor audits its next step as the one that went on does."""
    auditors = []

    def learner(folder):
        auditors.append(rewards.RewardAuditor(log=lambda line: None))
        return _learner(GRPOLearner, GRPOConfig(group_size=2, beta=0.0), output_dir=folder, reward_audit=auditors[-1])

    on = learner(tmp_path / "on")
    on.train_step()
    on.train_step()
    # numeric_answer pays nothing to the untrained policy: constant within every group, 2 steps running
    assert on.state.audit == auditors[0].state_json() and on.state.audit["streaks"]["numeric_answer"] == 2
    on.train(on.step)  # no step left to run: the checkpoint, on disk when train returns
    resumed = learner(tmp_path / "on")
    assert resumed.resume(log=lambda line: None)
    assert auditors[1].state_json() == on.state.audit == resumed.state.audit  # the streak of 2 included
    went_on, after_resume = on.train_step(), resumed.train_step()
    audited = {k: v for k, v in went_on.items() if k.startswith("reward_audit/")}
    assert audited and audited == {k: v for k, v in after_resume.items() if k.startswith("reward_audit/")}
    on.close()
    resumed.close()

