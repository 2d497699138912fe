"""Partial rollouts on the paged engine (rl_core.rollout.feed, `rollout.partial_rollouts`): weights
published mid-rollout decode the calls after it; every token keeps the version that sampled it
and its log-prob under that version.

The switch is placed by publishing from `engine.call` once call 2 has returned, so call 3 is the
first under the new weights. 4 slots for 6 samples: the first 4 start in call 1 and switch after
4 tokens (2 steps a call); the last 2 start after the switch, on a prompt prefilled in call 2.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rl_core.policy.logprobs import completion_logprobs
from rl_core.policy.tokens import left_pad
from rl_core.rollout.backend import Requests
from rl_core.rollout.feed import WeightFeed
from rl_core.rollout.paged import EngineSettings, PagedBackend
from rl_core.rollout.sampler import SamplingParams
from rl_models import PAGED_TRANSFORMER, Transformer, TransformerConfig
from tolerances import close

V = 64
T = 10
STEPS = 2  # decode steps per call
SWITCH = 2  # the new weights arrive after call 2: tokens 0..3 of the first rows are the old weights'
ROWS = 6
SAMPLED = SamplingParams(temperature=1.0)
SETTINGS = EngineSettings(max_prompt_tokens=10, max_new_tokens=T, page_size=4, slots=4, prefill_chunk=16,
                          steps_per_sync=STEPS)
EOS = (V + 1,)  # never sampled: every completion runs T tokens, so each has tokens after the switch


def tiny(seed):
    return Transformer(TransformerConfig.tiny(V), rngs=nnx.Rngs(seed))


GRAPHDEF = nnx.split(tiny(0))[0]
INFER_GRAPHDEF = nnx.split(PAGED_TRANSFORMER.inference_copy(tiny(0)))[0]


@pytest.fixture(scope="module")
def models():
    return tiny(0), tiny(1)  # the old weights (version 0) and the new ones (version 1)


@pytest.fixture(scope="module")
def engines():
    return {mode: PagedBackend(GRAPHDEF, SETTINGS, paging=PAGED_TRANSFORMER, eos_ids=EOS, pad_id=0,
                               partial_rollouts=mode) for mode in ("continue", "recompute")}


def requests():
    rng = np.random.default_rng(0)
    return Requests(*left_pad([rng.integers(6, V, n).tolist() for n in (7, 5, 9)], pad_id=0, max_tokens=10),
                    num_samples=2)


def prompt_rows():
    prompts = requests()
    return np.repeat(prompts.prompt_tokens, 2, 0), np.repeat(prompts.prompt_mask, 2, 0)


def rollout(engine, models, switch_after=None):
    """Completions from the old weights (version 0), the new ones (version 1) published once call
    `switch_after` returns (never when None); every page is free afterwards."""
    engine.update_weights(nnx.split(models[0])[1], 0)
    call, calls = type(engine).call.__get__(engine), [0]

    def publishing(*args):
        out = call(*args)
        calls[0] += 1
        if calls[0] == switch_after:
            engine.feed.publish(1, nnx.split(models[1])[1])
        return out

    engine.call = publishing
    try:
        out = engine.generate(requests(), SAMPLED, jax.random.key(4))
    finally:
        del engine.call
    assert all(pool.in_use == 0 for pool in engine.pools)
    return out


@jax.jit
def _teacher_forced(state, tokens, mask, completion):
    return completion_logprobs(nnx.merge(GRAPHDEF, state), tokens, mask, completion)[0]


def teacher_forced(model, tokens, mask, completion):
    """[B, T] log-probs of `completion` under `model`'s whole forward (every key and value its own)."""
    return np.asarray(_teacher_forced(nnx.split(model)[1], tokens, mask, completion))


def mixed_kv_logprobs(engine, models, prompt, completion, first_new):
    """Log-probs of completion[first_new:] when the old model wrote the keys and values of the
    sequence before the new model's first input (the prompt and completion[:first_new - 1]) and
    the new model computes from there on: two chunks of the paged forward on a fresh pool."""
    seq = np.concatenate([prompt, completion]).astype(np.int32)
    split, end = len(prompt) + first_new - 1, len(prompt) + len(completion) - 1
    n = SETTINGS.max_prompt_tokens + T
    chunks = []  # each padded to n tokens, the padding on the scratch page 0 (as the engine's chunks)
    for start, stop in ((0, split), (split, end)):
        real = np.arange(n) < stop - start
        chunks.append((np.where(real, np.pad(seq[start:stop], (0, n - stop + start)), 0),
                       np.where(real, np.arange(start, start + n), 0), real))
    targets = np.pad(seq[split + 1 :], (0, n - end + split))
    return np.asarray(_mixed(engine.kv, *inference_weights(models), *chunks[0], *chunks[1], targets))[: end - split]


@functools.cache
def inference_weights(models):
    return tuple(nnx.split(PAGED_TRANSFORMER.inference_copy(m))[1] for m in models)


@functools.partial(jax.jit, static_argnums=0)
def _mixed(kv, old, new, old_tokens, old_positions, old_real, new_tokens, new_positions, new_real, targets):
    m = SETTINGS.pages_per_sequence
    old, new = (nnx.merge(INFER_GRAPHDEF, x) for x in (old, new))
    pages = kv.init(*PAGED_TRANSFORMER.cache_spec(old), m + 1)
    row = jnp.arange(1, m + 1, dtype=jnp.int32)
    old_rows, new_rows = (jnp.where(real[:, None], row, 0) for real in (old_real, new_real))
    _, pages = PAGED_TRANSFORMER.forward(old, old_tokens, old_positions, pages, old_rows, kv)
    hidden, _ = PAGED_TRANSFORMER.forward(new, new_tokens, new_positions, pages, new_rows, kv)
    logp = jax.nn.log_softmax(new.logits(hidden).astype(jnp.float32), axis=-1)
    return jnp.take_along_axis(logp, targets[:, None], axis=-1)[:, 0]


@pytest.mark.parametrize("mode", ["continue", "recompute"])
def test_tokens_after_a_switch_carry_the_new_version_and_its_logprobs(engines, models, mode):
    engine = engines[mode]
    alone = rollout(engine, models)  # the old weights only
    got = rollout(engine, models, switch_after=SWITCH)
    assert engine.switches == 1
    first_new = STEPS * SWITCH
    assert (got.lengths == T).all() and (alone.lengths == T).all()
    # the first 4 rows: the old weights' tokens and log-probs before the switch, version 0
    np.testing.assert_array_equal(got.tokens[:4, :first_new], alone.tokens[:4, :first_new])
    np.testing.assert_array_equal(got.logp[:4, :first_new], alone.logp[:4, :first_new])
    versions = np.asarray([[0] * first_new + [1] * (T - first_new)] * 4 + [[1] * T] * 2)
    np.testing.assert_array_equal(got.token_version, versions)
    np.testing.assert_array_equal(got.version, [0, 0, 0, 0, 1, 1])  # a row's oldest token's
    assert not np.array_equal(got.tokens[:, first_new:], alone.tokens[:, first_new:])  # the new weights sampled
    tokens, mask = prompt_rows()
    old_logp = teacher_forced(models[0], tokens, mask, got.tokens)
    np.testing.assert_allclose(got.logp[:4, :first_new], old_logp[:4, :first_new], **close(rtol=1e-5, atol=1e-5))
    new_logp = teacher_forced(models[1], tokens, mask, got.tokens)
    new = versions == 1
    if mode == "recompute":  # every key and value recomputed (prompt prefixes too): the new weights' forward
        np.testing.assert_allclose(got.logp[new], new_logp[new], **close(rtol=1e-5, atol=1e-5))
        return
    # continue: the new weights over the keys and values the old ones wrote before the switch
    # (for the last 2 rows, their prompt's prefix, prefilled in call 2)
    for row in range(ROWS):
        start = int(np.argmax(new[row]))
        want = mixed_kv_logprobs(engine, models, tokens[row][mask[row] > 0], got.tokens[row], start)
        np.testing.assert_allclose(got.logp[row, start:], want, **close(rtol=1e-5, atol=1e-5))
        # which is not the new weights' own forward (the mixing is what the test sees)
        assert np.abs(got.logp[row, start:] - new_logp[row, start:]).max() > 1e-3


def test_a_publish_with_an_older_version_is_an_error():
    feed = WeightFeed()
    feed.publish(100, None)
    with pytest.raises(ValueError, match="published weight version 100 after version 100"):
        feed.publish(100, None)
    assert feed.newer_than(99) == (100, None) and feed.newer_than(100) is None
    feed.forget_through(100)
    assert feed.version is None


def test_without_partial_rollouts_the_engine_has_no_feed():
    engine = PagedBackend(GRAPHDEF, SETTINGS, paging=PAGED_TRANSFORMER, eos_ids=EOS, pad_id=0)
    assert engine.feed is None and not engine.follow_feed()
    with pytest.raises(ValueError, match="partial_rollouts = 'sometimes': must be one of off, continue, recompute"):
        PagedBackend(GRAPHDEF, SETTINGS, paging=PAGED_TRANSFORMER, eos_ids=EOS, pad_id=0, partial_rollouts="sometimes")
