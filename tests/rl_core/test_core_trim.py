"""rl_core.train.trim and the learner's passes at the trimmed width."""

import importlib.util
from pathlib import Path

import jax
import numpy as np
import pytest

from rl_core.config import RolloutConfig, TrainingConfig
from rl_core.train.behaviour import PolicyLogprobs
from rl_core.train.trim import trim_example, trimmed_width
from rl_core.types import TrainExample
from tolerances import close

_spec = importlib.util.spec_from_file_location("rl_core_test_toy_run", Path(__file__).parent / "scripts" / "toy_run.py")
toy_run = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(toy_run)


def mask_with_lengths(lengths, t):
    return (np.arange(t)[None, :] < np.asarray(lengths)[:, None]).astype(np.float32)


@pytest.mark.parametrize(
    ("lengths", "t", "width"),
    [
        ([3, 1], 32, 8),  # within one chunk of 8
        ([9, 2], 32, 16),  # 9 tokens: two chunks
        ([17, 8], 32, 32),  # 17: the next power of two, 32
        ([5, 30], 32, 32),  # the longest row decides
        ([0, 0], 32, 8),  # nothing real: the smallest width
        ([4, 2], 5, 5),  # never wider than the completions
    ],
)
def test_trimmed_width_is_a_power_of_two_number_of_chunks(lengths, t, width):
    assert trimmed_width(mask_with_lengths(lengths, t), 8) == width


def test_a_hole_in_the_mask_does_not_shorten_the_width():
    mask = mask_with_lengths([12, 3], 32)
    mask[0, :11] = 0  # only column 11 is real: it still needs 12 columns
    assert trimmed_width(mask, 4) == 16


@pytest.fixture(scope="module")
def learner():
    training = TrainingConfig(optimizer="sgd", learning_rate=0.1, prompts_per_step=2, num_steps=5)
    rollout = RolloutConfig(max_prompt_tokens=16, max_new_tokens=32, logprob_chunk_tokens=4, engine="static")
    return toy_run.make_learner(training=training, rollout=rollout)


def example(learner, lengths, t=32):
    b = learner.layout.batch_size
    rng = np.random.default_rng(0)
    tokens, mask = learner.generator.encode(learner.supply().stream.next(2))
    return TrainExample(
        np.repeat(tokens, 4, axis=0), np.repeat(mask, 4, axis=0), rng.integers(3, 20, (b, t)).astype(np.int32),
        mask_with_lengths(lengths, t), np.linspace(-1, 1, b).astype(np.float32),
    )


def test_learner_passes_run_at_the_trimmed_width(learner, monkeypatch):
    widths = {"logprobs": [], "update": []}
    policy = learner.models["policy"]
    passes = PolicyLogprobs(policy, learner.rollout)  # the log-prob pass the pipeline's learner runs
    logprobs, update = passes.program.program, policy.update_step

    def spy_logprobs(params, frozen, inputs):
        widths["logprobs"].append(inputs[2].shape[-1])  # (prompt_tokens, prompt_mask, completion_tokens)
        return logprobs(params, frozen, inputs)

    def spy_update(state, frozen, batch):
        widths["update"].append(batch.completion_tokens.shape[-1])
        return update(state, frozen, batch)

    monkeypatch.setattr(passes.program, "program", spy_logprobs)
    monkeypatch.setattr(policy, "update_step", spy_update)
    ex = example(learner, [5, 3, 1, 2, 6, 4, 1, 1])  # longest 6: two chunks of 4 -> 8
    logp, entropy = passes(learner.params, ex)
    full, _ = passes.program(learner.params, ex.prompt_tokens, ex.prompt_mask, ex.completion_tokens)  # no mask
    learner.update_models(ex)
    assert widths == {"logprobs": [8, 32], "update": [8]}  # 32: the untrimmed pass, for comparison
    assert logp.shape == entropy.shape == (8, 32)  # padded back to the completions' width
    # the same values as the untrimmed pass where they count, zeros past the width
    np.testing.assert_allclose(np.asarray(logp)[:, :8], np.asarray(full)[:, :8], **close(rtol=1e-6, atol=1e-6))
    assert not np.asarray(logp)[:, 8:].any()


def test_trim_example_cuts_every_token_field():
    x = np.zeros((2, 16))
    ex = trim_example(TrainExample(x, x, x, x, np.zeros(2), old_logp=x, ref_logp=None, sampler_logp=x,
                                   teacher_logp=x), 4)
    assert ex.prompt_tokens.shape == (2, 16)  # prompts keep theirs
    fields = (ex.completion_tokens, ex.completion_mask, ex.old_logp, ex.sampler_logp, ex.teacher_logp)
    assert [f.shape for f in fields] == [(2, 4)] * 5
    assert ex.ref_logp is None
    jax.tree.map(lambda a: a, ex)  # still a pytree
