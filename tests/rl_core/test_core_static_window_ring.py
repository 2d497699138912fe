"""The static sampler over window-sized rings (rl_models.rings): a windowed layer's cache holds its
window's slots only, and the sampler still generates token for token what the full forward pass
predicts, with the learner's log-probs.

Fixtures: tiny Gemma 3 (five 4-slot windowed layers to one global) and Mistral (every layer a
5-slot window). Prompts of up to 14 tokens (left-padded to 16) are longer than the rings, and 16
new tokens wrap a 4-slot ring four times; each prompt's cache is copied to its 2 samples."""

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rl_core.policy.logprobs import completion_logprobs
from rl_core.policy.protocols import decode_cache
from rl_core.policy.tokens import left_pad
from rl_core.rollout.backend import Requests
from rl_core.rollout.sampler import GREEDY, SamplingParams
from rl_models.hf import load_hf_model
from rl_models.rings import RingKV
from engines import full_forward_greedy, static_engine
from tolerances import close

HF = Path(__file__).resolve().parents[1] / "fixtures" / "hf"
T = 16
NO_EOS = (10_000,)  # outside the vocabulary: every completion runs T tokens


@pytest.fixture(scope="module", params=[("gemma3_text", True),
                                        pytest.param(("gemma3_text", False), marks=pytest.mark.e2e),
                                        pytest.param(("mistral", False), marks=pytest.mark.e2e),
                                        pytest.param(("mistral", True), marks=pytest.mark.e2e)],
                ids=["gemma3-scanned", "gemma3-unrolled", "mistral-unrolled", "mistral-scanned"])
def model(request):
    name, scan = request.param
    return load_hf_model(HF / name, scan_layers=scan)


def prompts():
    rng = np.random.default_rng(0)
    return left_pad([rng.integers(3, 300, n).tolist() for n in (3, 14, 9, 6)], pad_id=0, max_tokens=16)


def test_the_samplers_cache_is_window_sized(model):
    """The cache the sampler builds for 4 prompts of 16 tokens and 16 new ones: a windowed layer
    holds W slots, a global one all 32."""
    cache, _ = decode_cache(model, 4, 16 + T)
    windowed = model.config.windowed()
    if isinstance(cache, RingKV):  # scanned: one stack per kind
        assert cache.ring[0].shape == (sum(windowed), 4, 2, model.config.sliding_window, 16)
        assert cache.full is None if all(windowed) else cache.full[0].shape == (1, 4, 2, 16 + T, 16)
    else:  # unrolled: one buffer per layer
        want = [model.config.sliding_window if w else 16 + T for w in windowed]
        assert [k.shape for k in cache[0]] == [(4, 2, n, 16) for n in want]


def test_static_sampler_over_rings_generates_what_the_full_forward_predicts(model):
    tokens, mask = prompts()
    out = static_engine(model, max_new_tokens=T, eos_ids=NO_EOS).generate(Requests(tokens, mask, 2), GREEDY,
                                                                           jax.random.key(0))
    assert out.mask.sum() == 2 * len(tokens) * T
    rows = np.repeat(tokens, 2, axis=0), np.repeat(mask, 2, axis=0)
    np.testing.assert_array_equal(np.asarray(out.tokens), full_forward_greedy(model, *rows, out.tokens))


def test_static_sampler_over_rings_logprobs_equal_the_learner_pass(model):
    tokens, mask = prompts()
    out = static_engine(model, max_new_tokens=T, eos_ids=NO_EOS).generate(
        Requests(tokens, mask, 2), SamplingParams(temperature=0.7), jax.random.key(5))
    graphdef, state = nnx.split(model)
    logp, _ = jax.jit(lambda s, p, m, c: completion_logprobs(nnx.merge(graphdef, s), p, m, c, temperature=0.7))(
        state, np.repeat(tokens, 2, axis=0), np.repeat(mask, 2, axis=0), jnp.asarray(out.tokens))
    np.testing.assert_allclose(out.logp, np.asarray(logp) * out.mask, **close(rtol=1e-5, atol=1e-5))


@pytest.mark.e2e
def test_static_sampler_over_rings_with_experts_and_sinks_scanned():
    """gpt-oss (alternating windowed and global layers, sink logits, routed experts) with its layers
    scanned: the full forward's tokens, and each token's recorded routing in model order."""
    model = load_hf_model(HF / "gpt_oss", scan_layers=True)
    cache, _ = decode_cache(model, 4, 16 + T)
    assert isinstance(cache, RingKV) and cache.ring[0].shape[3] == model.config.sliding_window < 16 + T
    tokens, mask = prompts()
    out = static_engine(model, max_new_tokens=T, eos_ids=NO_EOS).generate(Requests(tokens, mask), GREEDY,
                                                                           jax.random.key(0))
    np.testing.assert_array_equal(np.asarray(out.tokens), full_forward_greedy(model, tokens, mask, out.tokens))
    routing = np.asarray(out.routing)
    assert routing.shape == (4, T, model.config.num_layers, model.config.experts_per_token)
    assert ((routing >= 0) & (routing < model.config.num_experts)).all()
    # the same experts, layer by layer, as the unrolled model's (its per-layer rings) record
    unrolled = static_engine(load_hf_model(HF / "gpt_oss"), max_new_tokens=T, eos_ids=NO_EOS).generate(
        Requests(tokens, mask), GREEDY, jax.random.key(0))
    np.testing.assert_array_equal(routing, np.asarray(unrolled.routing))
