"""Partial rollouts in an async run (rollout.partial_rollouts with training.async_rollout =
"one_step" and the paged engine): the update of step n publishes W(n) to the collection of batch
n+1 still decoding, whose remaining tokens sample with it; each token keeps its version.

Where the switch falls depends on when the update ends. To test it exactly, the engine's calls
are gated here: on the rollout thread, the engine takes no new weights before call 3 of a
collection and waits for them there, so calls 1-2 sample with W(n-1) and calls 3.. with W(n),
whatever the timing.
"""

import threading
import time

import numpy as np
import pytest
import rewards
import rl_models
from algo_grpo import GRPOConfig, GRPOLearner
from flax import nnx
from rl_core.config import RolloutConfig, TrainingConfig
from rl_core.data import Prompt
from rl_core.learner.groups import Groups
from rl_core.rollout.async_rollout import await_scoring
from rl_core.testing import tree_max_abs_diff
from rl_core.testing import BAG_PAGING, BagPolicy
from tolerances import approx

TOK = rl_models.CharTokenizer()
PROMPTS = [Prompt(f"{a}+{b}=", {"answer": str(a + b)}) for a in range(1, 7) for b in range(1, 5)]
STEPS_PER_CALL = 2
GATED_CALL = 3  # the first call of a collection beside an update that samples with its weights
GRPO = GRPOConfig(group_size=4, beta=0.0, num_iterations=2)


def even_start(prompts, completions, **_):
    return [float(bool(c) and ord(c[0]) % 2 == 0) for c in completions]


def make(*, output_dir=None, num_steps=4, partial="continue"):
    learner = GRPOLearner(
        GRPO,
        policy=BagPolicy(TOK.vocab_size, rngs=nnx.Rngs(0)),
        paging=BAG_PAGING,
        tokenizer=TOK,
        train_data=PROMPTS,
        training=TrainingConfig(prompts_per_step=2, learning_rate=0.3, num_steps=num_steps, checkpoint_every_steps=1,
                                async_rollout="one_step"),
        rollout=RolloutConfig(max_new_tokens=8, max_prompt_tokens=8, temperature=1.0, engine="paged",
                              options={"slots": 8, "page_size": 4, "steps_per_sync": STEPS_PER_CALL},
                              partial_rollouts=partial),
        reward_manager=rewards.RewardManager([even_start]),
        output_dir=output_dir,
    )
    gate(learner.generator.backend)
    return learner


def gate(engine):
    """On the rollout thread, the engine takes no new weights before its first GATED_CALL - 1
    calls of a rollout, then waits for them (the update beside it publishes them) and takes them
    before call GATED_CALL: the switch falls there however long the update takes."""
    generate, call, follow = engine.generate, engine.call, engine.follow_feed
    calls = [0]

    def counted_generate(*args):
        calls[0] = 0
        return generate(*args)

    def counted_call(*args):
        calls[0] += 1
        return call(*args)

    def gated_follow():
        if not threading.current_thread().name.startswith("rollout"):
            return follow()
        if calls[0] < GATED_CALL - 1:
            return False
        if calls[0] == GATED_CALL - 1:
            deadline = time.monotonic() + 120
            while engine.feed.newer_than(engine.version) is None:
                assert time.monotonic() < deadline, "no weights published beside the collection"
                time.sleep(0.005)
        return follow()

    engine.generate, engine.call, engine.follow_feed = counted_generate, counted_call, gated_follow


@pytest.mark.e2e  # three learners, about 7 s on 2 cores
def test_tokens_after_the_update_sample_with_its_weights_and_resume_is_exact(tmp_path):
    straight = make()
    history = straight.train()
    engine = straight.generator.backend
    assert engine.switches >= 3  # every collection beside an update (steps 2, 3, 4: step 1 fills in line)
    assert all(pool.in_use == 0 for pool in engine.pools)
    # step 1 trains batch 1 (W(0), in line); step n >= 2 trains batch n, collected beside update n-1: its
    # first 2 calls' tokens by W(n-2) (lag 1), the rest by W(n-1) (lag 0), the weights that train on it
    assert history[0]["rollout/staleness_token_lag_max"] == 0.0
    for m in history[1:]:
        assert m["rollout/staleness_token_lag_max"] == 1.0
        assert 0.0 < m["rollout/staleness_current_frac"] < 1.0
        assert m["rollout/staleness_token_lag_mean"] == approx(1.0 - m["rollout/staleness_current_frac"])
    [flight] = await_scoring(straight.state.in_flight)  # batch 5, collected beside update 4: versions 3 then 4
    groups = flight.batch
    assert flight.version == 3
    lengths = groups.lengths
    for row, n in enumerate(lengths):
        want = [3] * min(n, 2 * STEPS_PER_CALL) + [4] * max(n - 2 * STEPS_PER_CALL, 0)
        np.testing.assert_array_equal(groups.token_version[row, :n], want)
    assert (lengths > 2 * STEPS_PER_CALL).any()  # some rows have tokens after the switch
    back = Groups.from_json(groups.to_json())
    np.testing.assert_array_equal(back.token_version, groups.token_version)
    np.testing.assert_array_equal(back.sampler_logp, groups.sampler_logp)

    # stopped at step 2 with batch 3 in flight (its tokens of W(1) and W(2)), resumed: the same run
    stopped = make(output_dir=tmp_path / "run")
    stopped.train(2)
    stopped.close()
    resumed = make(output_dir=tmp_path / "run")
    assert resumed.resume(log=lambda _: None) and resumed.step == 2
    [flight] = await_scoring(resumed.state.in_flight)
    assert set(flight.batch.token_version[flight.batch.completion_mask > 0].tolist()) == {1, 2}
    resumed.train()
    resumed.close()
    assert tree_max_abs_diff(resumed.params, straight.params) == 0.0
    untimed = lambda h: [{k: v for k, v in m.items() if not k.startswith(("time/", "perf/"))} for m in h]  # noqa: E731
    assert untimed(resumed._recorder.history[-2:]) == untimed(history[2:])
    assert [m["step"] for m in resumed._recorder.history[-2:]] == [3, 4]


def test_partial_rollouts_need_async_rollouts_and_the_paged_engine():
    with pytest.raises(ValueError, match=r"partial_rollouts = 'continue': .* rollout.engine='static' does not"):
        RolloutConfig(partial_rollouts="continue")
    with pytest.raises(ValueError, match="partial_rollouts = 'recompute': needs training.async_rollout='one_step'"):
        GRPOLearner(GRPO, policy=BagPolicy(TOK.vocab_size, rngs=nnx.Rngs(0)), paging=BAG_PAGING, tokenizer=TOK,
                    train_data=PROMPTS, training=TrainingConfig(prompts_per_step=2),
                    rollout=RolloutConfig(engine="paged", partial_rollouts="recompute"),
                    reward_manager=rewards.RewardManager([even_start]))
