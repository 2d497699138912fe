"""Qwen3.5's fixed-size recurrent state through rl_core's static sampler and the learner's
passes: the sampler generates what transformers generates, its log-probs are the full
forward's, and the scoring pass gives the same log-probs unshared, with each group's prompt
run once (the state copied to the group's rows) and packed (the state restarting per segment)."""

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rl_core.policy.logprobs import completion_logprobs
from rl_core.rollout.sampler import GREEDY, Sampler, SamplingParams
from rl_core.train.packing import pack
from rl_core.types import SharedPrompts
from rl_models.hf import load_hf_model, load_hf_tokenizer
from tolerances import close

HF = Path(__file__).resolve().parents[1] / "fixtures" / "hf"


@pytest.fixture(scope="module")
def qwen35():
    return load_hf_model(HF / "qwen35")


def test_static_sampler_generates_what_transformers_generates(qwen35, hf_reference):
    arrays, _ = hf_reference("qwen35")
    tok = load_hf_tokenizer(HF / "qwen35")
    graphdef, state = nnx.split(qwen35)
    sampler = Sampler(graphdef, max_new_tokens=10, eos_ids=tok.eos_ids, pad_id=tok.pad_id)
    out = sampler(state, jnp.asarray(arrays["prompt_ids"]), jnp.asarray(arrays["prompt_mask"]), jax.random.key(0),
                  GREEDY, num_samples=2)
    # every prompt's state is copied to its 2 samples after one prefill
    np.testing.assert_array_equal(np.asarray(out.tokens), np.repeat(arrays["greedy_ids"], 2, axis=0))


def test_sampler_logprobs_are_the_full_forwards_and_scoring_shares_and_packs_alike(qwen35):
    """Sampled completions (temperature 1, 2 per prompt); the learner's pass over prompt +
    completion without any cache gives the sampler's log-probs; sharing each prompt across its
    group and packing the sequences give the same again."""
    tok = load_hf_tokenizer(HF / "qwen35")
    prompts = [tok.encode("What is 12 + 30?"), tok.encode("Solve: 3 * x")]
    width = max(map(len, prompts))
    prompt_ids = np.array([[tok.pad_id] * (width - len(p)) + p for p in prompts], np.int32)
    prompt_mask = np.array([[0] * (width - len(p)) + [1] * len(p) for p in prompts], np.float32)
    graphdef, state = nnx.split(qwen35)
    sampler = Sampler(graphdef, max_new_tokens=12, eos_ids=(tok.pad_id,), pad_id=tok.pad_id)
    out = sampler(state, jnp.asarray(prompt_ids), jnp.asarray(prompt_mask), jax.random.key(3),
                  SamplingParams(temperature=1.0), num_samples=2)
    rows_ids, rows_mask = np.repeat(prompt_ids, 2, axis=0), np.repeat(prompt_mask, 2, axis=0)
    mask = np.asarray(out.mask)
    assert len({tuple(r) for r in np.asarray(out.tokens)}) == 4  # four different completions

    def score(**kwargs):
        return jax.jit(lambda m: completion_logprobs(m, jnp.asarray(rows_ids), jnp.asarray(rows_mask), out.tokens,
                                                     **kwargs)[0])(qwen35)

    plain = np.asarray(score())
    np.testing.assert_allclose(plain * mask, np.asarray(out.logp), **close(atol=1e-4))
    shared = np.asarray(score(shared=SharedPrompts(jnp.asarray(prompt_ids), jnp.asarray(prompt_mask))))
    # log-probs down to -7 summed in another order: a few float32 ulps of their size (2.5e-6 relative on
    # one XLA:CPU build, 1.8e-5 absolute), so the bound is relative too
    np.testing.assert_allclose(shared * mask, plain * mask, **close(rtol=1e-5, atol=1e-5))
    packed = pack(rows_ids, rows_mask, np.asarray(out.tokens), mask, width=2 * (width + 12))
    assert int((np.asarray(packed.segments).max(axis=1) > 1).sum()) >= 1  # some row holds two sequences
    np.testing.assert_allclose(np.asarray(score(packed=packed)) * mask, plain * mask,
                               **close(rtol=1e-5, atol=1e-5))
