"""rl_core.learner.base: exact micro-batching, the non-finite guard and a fixed set of compiled programs.

Most tests train `ToyLearner` (loss -A * logp, aggregated by the configured
mode) on one hand-made batch, so that every learner sees identical data and
starts from identical parameters.
"""

import dataclasses
import functools
import importlib.util
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rl_core.runtime.compiles import compile_count
from rl_core.config import RolloutConfig, TrainingConfig
from rl_core.data import Prompt, PromptStream
from rl_core.learner.base import NonFiniteUpdateError, StepBatch
from rl_core.policy.logprobs import completion_logprobs
from rl_core.registry import get
from rl_core.testing import ToyConfig, ToyLearner, stage
from rl_core.types import TrainExample
from tolerances import approx, close

_spec = importlib.util.spec_from_file_location("rl_core_test_toy_run", Path(__file__).parent / "scripts" / "toy_run.py")
toy_run = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(toy_run)

P, T = 8, 8
ROLLOUT = RolloutConfig(max_prompt_tokens=P, max_new_tokens=T)
LR = 0.1  # updates of about 0.05: a wrong denominator would show at 1e-2, float noise stays below 1e-6


def hand_made_batch() -> TrainExample:
    """4 completions (2 prompts x 2) with different prompt lengths, completion lengths
    8, 3, 0 (a filtered completion) and 5, and advantages of both signs."""
    rng = np.random.default_rng(0)
    v = toy_run.TOKENIZER.vocab_size
    prompt_mask = np.zeros((4, P), np.float32)
    for row, n in enumerate((3, 3, 7, 7)):
        prompt_mask[row, P - n :] = 1
    completion_mask = np.zeros((4, T), np.float32)
    for row, n in enumerate((8, 3, 0, 5)):
        completion_mask[row, :n] = 1
    return TrainExample(
        prompt_tokens=jnp.asarray(np.where(prompt_mask > 0, rng.integers(3, v, (4, P)), 0), jnp.int32),
        prompt_mask=jnp.asarray(prompt_mask),
        completion_tokens=jnp.asarray(np.where(completion_mask > 0, rng.integers(3, v, (4, T)), 0), jnp.int32),
        completion_mask=jnp.asarray(completion_mask),
        advantages=jnp.asarray([1.0, -0.5, 0.75, -2.0], jnp.float32),
    )


class FixedBatchLearner(ToyLearner):
    """ToyLearner that trains on `hand_made_batch()` instead of sampling."""

    def _collect(self, prompts, supply):
        return StepBatch(hand_made_batch(), {"rewards/total/mean": 0.0}), supply


def fixed_learner(training: TrainingConfig, toy: ToyConfig) -> FixedBatchLearner:
    return FixedBatchLearner(
        toy, policy=toy_run.policy(), tokenizer=toy_run.TOKENIZER, train_data=toy_run.DATA,
        training=training, rollout=ROLLOUT,
    )


def leaves(tree) -> list[np.ndarray]:
    return [np.array(x) for x in jax.tree.leaves(jax.device_get(tree))]


def max_diff(a: list[np.ndarray], b: list[np.ndarray]) -> float:
    return max(float(np.max(np.abs(x - y))) for x, y in zip(a, b, strict=True))


# -- micro-batching --------------------------------------------------------------------------


@functools.cache
def plain_sgd_step(mode: str) -> list[np.ndarray]:
    """params - LR * grad of (aggregated total / denominator) over the whole batch, no accumulation."""
    graphdef, params = nnx.split(toy_run.policy(), nnx.Param)
    example = hand_made_batch()

    @jax.jit
    def step(params):
        def loss(p):
            logp, _ = completion_logprobs(
                nnx.merge(graphdef, p), example.prompt_tokens, example.prompt_mask, example.completion_tokens
            )
            total, denom = get("loss_aggregation", mode)(
                -example.advantages[:, None] * logp, example.completion_mask, max_len=T
            )
            return total / denom

        return jax.tree.map(lambda p, g: p - LR * g, params, jax.grad(loss)(params))

    return leaves(step(params))


# three learners per mode: the second mode runs in the e2e tier (the pure loss-invariance
# sweep, tests/algos/test_algo_loss_invariance.py, covers every mode in the fast tier)
@pytest.mark.parametrize("mode", ["token-mean", pytest.param("seq-mean-token-mean", marks=pytest.mark.e2e)])
def test_micro_batch_size_does_not_change_the_update(mode):
    initial = leaves(nnx.state(toy_run.policy(), nnx.Param))
    results = {}
    for micro in (1, 2, None):  # 4, 2 and 1 accumulated micro-batches
        training = TrainingConfig(
            optimizer="sgd", learning_rate=LR, max_grad_norm=None, prompts_per_step=2, micro_batch_size=micro
        )
        learner = fixed_learner(training, ToyConfig(group_size=2, loss_agg_mode=mode))
        assert learner.layout.num_micro_batches == 4 // (micro or 4)
        metrics = learner.train_step()
        assert metrics["train/updates"] == 1.0 and metrics["train/skipped_updates"] == 0.0
        results[micro] = (leaves(learner.params), metrics["train/loss"])

    full_batch, full_loss = results[None]
    for micro in (1, 2):
        params, loss = results[micro]
        for got, want in zip(params, full_batch, strict=True):  # chunked: another program, float32 noise
            np.testing.assert_allclose(got, want, **close(rtol=1e-6, atol=1e-6), err_msg=f"micro_batch_size={micro}")
        assert loss == approx(full_loss, rel=1e-6, abs=1e-6)
    # and the full-batch update is plain SGD on the aggregated loss (a composite: 1e-5)
    expected = plain_sgd_step(mode)
    assert max_diff(expected, initial) > 1e-2  # the step really moves the parameters
    assert max_diff(full_batch, expected) <= 1e-5


def test_the_two_modes_really_weigh_tokens_differently():
    """Guards the test above: token-mean and seq-mean-token-mean differ on this batch."""
    assert max_diff(plain_sgd_step("token-mean"), plain_sgd_step("seq-mean-token-mean")) > 1e-3


# -- non-finite guard -------------------------------------------------------------------------


def test_nan_loss_is_skipped_and_counted_and_never_reaches_the_parameters():
    training = TrainingConfig(prompts_per_step=2, micro_batch_size=2, learning_rate=1e-2)  # adamw
    learner = fixed_learner(training, ToyConfig(group_size=2, inject_nan=True))
    params, opt_state = leaves(learner.params), leaves(learner.state.policy.opt_state)
    for step in (1, 2):
        metrics = learner.train_step()
        assert metrics["train/skipped_updates"] == 1.0
        assert np.isnan(metrics["train/loss"])
        assert learner.state.updates.skipped == step
        assert learner.step == step  # the run goes on
    assert max_diff(leaves(learner.params), params) == 0.0
    assert max_diff(leaves(learner.state.policy.opt_state), opt_state) == 0.0  # not even Adam's step count moved
    assert all(np.isfinite(x).all() for x in leaves(learner.params))


def test_updates_skipped_in_a_row_stop_the_run_at_max_skipped_in_a_row():
    """Every update non-finite (a NaN weight, broken data): skipped 2 steps, the 3rd stops the run."""
    training = TrainingConfig(prompts_per_step=2, learning_rate=1e-2, max_skipped_in_a_row=3)
    learner = fixed_learner(training, ToyConfig(group_size=2, inject_nan=True))
    params = leaves(learner.params)
    learner.train_step()
    learner.train_step()
    assert learner.state.updates.skipped_in_a_row == 2
    with pytest.raises(NonFiniteUpdateError) as info:
        learner.train_step()
    message = str(info.value)
    assert message.startswith("step 3: the last 3 updates in a row had a non-finite loss or gradient")
    assert "training.max_skipped_in_a_row = 3" in message and "model's weights" in message
    assert max_diff(leaves(learner.params), params) == 0.0
    # the default (10) is documented on the field; 0 never stops
    assert TrainingConfig().max_skipped_in_a_row == 10
    never = fixed_learner(dataclasses.replace(training, max_skipped_in_a_row=0), ToyConfig(group_size=2, inject_nan=True))
    for _ in range(4):
        never.train_step()
    assert never.state.updates.skipped == 4


def test_updates_skipped_in_a_row_count_on_across_a_resume(tmp_path):
    """The guard's counts are the learner's state: 2 skipped, a checkpoint, and the resumed run's
    first skipped update is the 3rd in a row (a count that restarted would let it run on)."""
    training = TrainingConfig(prompts_per_step=2, learning_rate=1e-2, max_skipped_in_a_row=3)
    first = FixedBatchLearner(ToyConfig(group_size=2, inject_nan=True), policy=toy_run.policy(),
                              tokenizer=toy_run.TOKENIZER, train_data=toy_run.DATA, training=training,
                              rollout=ROLLOUT, output_dir=tmp_path)
    first.train(2)  # two steps, then the checkpoint
    first.close()
    resumed = FixedBatchLearner(ToyConfig(group_size=2, inject_nan=True), policy=toy_run.policy(),
                                tokenizer=toy_run.TOKENIZER, train_data=toy_run.DATA, training=training,
                                rollout=ROLLOUT, output_dir=tmp_path)
    assert resumed.resume(log=lambda line: None)
    assert resumed.state.updates == (2, 2, 0)  # skipped, skipped in a row, empty
    with pytest.raises(NonFiniteUpdateError, match="step 3: the last 3 updates in a row"):
        resumed.train_step()
    resumed.close()


def test_nan_loss_with_on_nonfinite_stop_raises_a_clear_error():
    training = TrainingConfig(prompts_per_step=2, learning_rate=1e-2, on_nonfinite="stop")
    learner = fixed_learner(training, ToyConfig(group_size=2, inject_nan=True))
    params = leaves(learner.params)
    with pytest.raises(NonFiniteUpdateError) as info:
        learner.train_step()
    message = str(info.value)
    assert "step 1" in message and "non-finite loss or gradient" in message
    assert "parameters were left unchanged" in message and "on_nonfinite='skip'" in message
    assert max_diff(leaves(learner.params), params) == 0.0


def test_an_empty_mini_batch_touches_neither_parameters_nor_optimizer_state_nor_schedule():
    # AdamW with weight decay and momentum from a real first update: a zero gradient would
    # still move every parameter (momentum, decay) and advance the schedule's count.
    training = TrainingConfig(
        prompts_per_step=2, mini_batch_size=2, learning_rate=1e-2, weight_decay=0.1, lr_schedule="linear"
    )
    learner = fixed_learner(training, ToyConfig(group_size=2))
    batch = hand_made_batch()
    # mini-batch 1: rows 0-1 (real tokens); mini-batch 2: rows 2-3 with every token masked
    empty_tail = batch._replace(completion_mask=batch.completion_mask.at[2:].set(0.0))
    first, second = learner.update_models(empty_tail)["policy"]
    assert not first["empty"] and first["finite"]
    assert second["empty"] and second["loss"] == 0.0
    after_first = leaves((learner.params, learner.state.policy.opt_state))
    learner.update_models(batch._replace(completion_mask=jnp.zeros_like(batch.completion_mask)))  # both empty
    assert max_diff(leaves((learner.params, learner.state.policy.opt_state)), after_first) == 0.0
    # the optimizer (and the schedule) counted one update, the first
    counts = [x for x in jax.tree.leaves(learner.state.policy.opt_state) if np.asarray(x).dtype == np.int32]
    assert counts and all(int(c) == 1 for c in counts)


def test_empty_updates_are_counted_in_the_metrics():
    class EmptyTail(FixedBatchLearner):
        def _collect(self, prompts, supply):
            batch = hand_made_batch()
            return StepBatch(batch._replace(completion_mask=batch.completion_mask.at[2:].set(0.0)), {}), supply

    learner = EmptyTail(
        ToyConfig(group_size=2), policy=toy_run.policy(), tokenizer=toy_run.TOKENIZER, train_data=toy_run.DATA,
        training=TrainingConfig(prompts_per_step=2, mini_batch_size=2), rollout=ROLLOUT,
    )  # fmt: skip
    metrics = learner.train_step()
    assert metrics["train/updates"] == 2.0 and metrics["train/empty_updates"] == 1.0
    assert metrics["train/skipped_updates"] == 0.0 and learner.state.updates.empty == 1


# -- compile count -----------------------------------------------------------------------------


# a learner per engine: static (the default at these lengths) in the fast tier, paged in e2e
# (the paged engine's own program count is checked in test_core_engine.py)
@pytest.mark.parametrize("engine", ["static", pytest.param("paged", marks=pytest.mark.e2e)])
def test_compile_count_stays_constant_after_each_bucket_is_seen(engine):
    short = [Prompt("1" * n) for n in range(2, 7)]  # 3..7 tokens with BOS: bucket 8
    long = [Prompt("2" * n) for n in range(9, 15)]  # 10..15 tokens: bucket 16
    training = TrainingConfig(optimizer="sgd", learning_rate=0.1, prompts_per_step=2, num_steps=100)
    rollout = RolloutConfig(max_prompt_tokens=16, max_new_tokens=8, engine=engine)
    learner = toy_run.make_learner(training=training, rollout=rollout, data=short)

    def steps(data, seed, n):
        """n steps on `data`; returns the longest prompt of each step (+1 for BOS)."""
        learner._data = PromptStream(data, seed=seed)  # a new prompt stream, from its start
        stage(learner, data_position=0)
        replay = PromptStream(data, seed=seed)
        lengths = [max(len(p.text) for p in replay.next(2)) + 1 for _ in range(n)]
        for _ in range(n):
            learner.train_step()
        return lengths

    steps(short, 0, 1)
    after_first = compile_count()
    lengths = steps(short, 1, 3)
    assert len(set(lengths)) > 1 and max(lengths) <= 8  # varying lengths within bucket 8
    assert compile_count() == after_first

    steps(long, 0, 1)  # a new bucket compiles its programs once
    after_buckets = compile_count()
    assert after_buckets > after_first
    for data, seed in ((short, 2), (long, 1), (short, 3), (long, 2)):
        steps(data, seed, 2)
    assert compile_count() == after_buckets
    if engine == "static":
        assert learner.generator.sampler.compiles == 2  # one sampler program per prompt bucket
    else:  # one weight refresh and one step program, whatever the prompts' bucket
        assert learner.generator.sampler.compiles == 0 and learner.generator.backend.compiles == 2
