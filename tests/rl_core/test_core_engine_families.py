"""Both rollout engines on the families beyond Llama / Qwen: windowed layers (Mistral, Gemma 3's
five to one), Gemma 3's two rotary thetas and sandwich norms, SmolLM3's layers without rope, and
YaRN. Each engine generates token for token what the full forward pass predicts, and its
log-probs are the learner's.

Prompts (up to 14 tokens) and completions (12) are longer than the fixtures' windows (5 and 4),
so every windowed layer drops keys; the paged engine's 4-token pages put whole pages outside
a window. Gemma 3 (windows, two thetas, every Gemma setting) is the fast tier's representative;
the other families and the preempting pool run in the e2e tier.
"""

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl_core.policy.logprobs import completion_logprobs
from rl_core.policy.tokens import left_pad
from rl_core.rollout.backend import Requests
from rl_core.rollout.paged import PagedBackend
from rl_core.rollout.sampler import GREEDY, SamplingParams
from rl_core.rollout.scheduler import pages_for_one
from rl_core.rollout.static import StaticBackend
from rl_models.hf import load_hf_model
from engines import full_forward_greedy, paged_engine, static_engine
from tolerances import close

HF = Path(__file__).resolve().parents[1] / "fixtures" / "hf"
T = 12
SMALL = dict(max_prompt_tokens=16, max_new_tokens=T, page_size=4, slots=3, prefill_chunk=8, steps_per_sync=3)
NO_EOS = (10_000,)  # outside the vocabulary: every completion runs T tokens


@pytest.fixture(scope="module", params=["gemma3_text", "gemma2", "olmo2", "olmo3", "gemma4_text", *(pytest.param(name, marks=pytest.mark.e2e)
                                                         for name in ("mistral", "smollm3", "qwen3_yarn"))])
def model(request):
    return load_hf_model(HF / request.param)


def prompts(lengths=(3, 14, 9, 6), seed=0):
    rng = np.random.default_rng(seed)
    return left_pad([rng.integers(3, 300, n).tolist() for n in lengths], pad_id=0, max_tokens=16)


def static(model) -> StaticBackend:
    return static_engine(model, max_new_tokens=T, eos_ids=NO_EOS)


def paged(model, **overrides) -> PagedBackend:
    return paged_engine(model, SMALL | overrides, eos_ids=NO_EOS)


def test_static_sampler_generates_what_the_full_forward_predicts(model):
    tokens, mask = prompts()
    out = static(model).generate(Requests(tokens, mask), GREEDY, jax.random.key(0))
    np.testing.assert_array_equal(np.asarray(out.tokens), full_forward_greedy(model, tokens, mask, out.tokens))


def test_paged_engine_generates_what_the_full_forward_predicts(model):
    tokens, mask = prompts()
    out = paged(model).generate(Requests(tokens, mask), GREEDY, jax.random.key(0))
    np.testing.assert_array_equal(np.asarray(out.tokens), full_forward_greedy(model, tokens, mask, out.tokens))


@pytest.mark.e2e
def test_paged_engine_rebuilds_windows_of_preempted_sequences(model):
    """A pool so small that sequences are preempted and prefilled again: the same tokens. (Mistral's
    layers are all windowed, so its samples give back the pages behind their window: a pool of 12
    pages never runs dry for it, one of 9, as small as one completion allows, does.)"""
    tokens, mask = prompts()
    engine = paged(model, slots=2, num_pages=9 if all(model.config.windowed()) else 12)
    out = engine.generate(Requests(tokens, mask), GREEDY, jax.random.key(0))
    assert engine.preemptions > 0
    np.testing.assert_array_equal(np.asarray(out.tokens), full_forward_greedy(model, tokens, mask, out.tokens))


@pytest.mark.e2e
def test_a_model_whose_every_layer_is_windowed_gives_back_the_pages_behind_its_windows():
    """Mistral (every layer a 5-slot window, 4-token pages): a sample decoding at position p holds
    no page wholly before p - 4, so two samples run side by side in a pool of 12 pages that two
    full-length sequences overflow (the same engine keeping every page preempts); the tokens
    are the full forward's either way."""
    model = load_hf_model(HF / "mistral")
    tokens, mask = prompts()
    rows = np.repeat(tokens, 2, 0), np.repeat(mask, 2, 0)
    engine = paged(model, slots=2, num_pages=12)
    assert engine.kv_window == 5
    assert pages_for_one(4, 14, T) + pages_for_one(4, 9, T) > 11  # two full sequences: more than the pool
    out = engine.generate(Requests(tokens, mask, 2), GREEDY, jax.random.key(0))
    assert engine.preemptions == 0 and engine.pools[0].in_use == 0
    np.testing.assert_array_equal(np.asarray(out.tokens), full_forward_greedy(model, *rows, out.tokens))
    engine.kv_window = None  # every page kept, as for a model with a global layer
    kept = engine.generate(Requests(tokens, mask, 2), GREEDY, jax.random.key(0))
    assert engine.preemptions > 0
    np.testing.assert_array_equal(kept.tokens, out.tokens)
    retained = paged(model, slots=2)  # a sample with a session keeps its whole sequence for the next turn
    retained.generate(Requests(tokens, mask, sessions=retained.new_sessions(4)), GREEDY, jax.random.key(0))
    assert retained.pools[0].in_use == sum(-(-(int(n) + T - 1) // 4) for n in mask.sum(1))


def test_paged_engine_logprobs_equal_the_learner_pass(model):
    tokens, mask = prompts()
    out = paged(model).generate(Requests(tokens, mask, 2), SamplingParams(temperature=0.7), jax.random.key(5))
    logp, _ = jax.jit(lambda p, m, c: completion_logprobs(model, p, m, c, temperature=0.7))(
        np.repeat(tokens, 2, axis=0), np.repeat(mask, 2, axis=0), jnp.asarray(out.tokens))
    np.testing.assert_allclose(out.logp, np.asarray(logp) * out.mask, **close(rtol=1e-5, atol=1e-5))
    assert out.mask.sum() == 2 * len(tokens) * T


@pytest.fixture(scope="module", params=[pytest.param(name, marks=pytest.mark.e2e) for name in ("qwen3_moe", "gpt_oss")])
def moe_model(request):
    return load_hf_model(HF / request.param)


def test_static_sampler_generates_what_the_full_forward_predicts_with_experts(moe_model):
    """Qwen3-MoE and gpt-oss (sinks, alternating windows, routed experts) decode token by token
    what the full forward predicts: each decoding step's routing is the full pass's."""
    tokens, mask = prompts()
    out = static(moe_model).generate(Requests(tokens, mask), GREEDY, jax.random.key(0))
    np.testing.assert_array_equal(np.asarray(out.tokens), full_forward_greedy(moe_model, tokens, mask, out.tokens))


def test_paged_engine_generates_what_the_full_forward_predicts_with_experts(moe_model):
    """Qwen3-MoE, and gpt-oss with its sink logits in the paged attention."""
    tokens, mask = prompts()
    out = paged(moe_model).generate(Requests(tokens, mask), GREEDY, jax.random.key(0))
    np.testing.assert_array_equal(np.asarray(out.tokens), full_forward_greedy(moe_model, tokens, mask, out.tokens))


def test_paged_engine_logprobs_equal_the_learner_pass_with_sinks():
    """gpt-oss on the paged engine: sinks (and windows, biases, experts) as the learner computes them."""
    model = load_hf_model(HF / "gpt_oss")
    assert model.config.attention_sinks
    tokens, mask = prompts()
    out = paged(model).generate(Requests(tokens, mask, 2), SamplingParams(temperature=0.7), jax.random.key(5))
    logp, _ = jax.jit(lambda p, m, c: completion_logprobs(model, p, m, c, temperature=0.7))(
        np.repeat(tokens, 2, axis=0), np.repeat(mask, 2, axis=0), jnp.asarray(out.tokens))
    np.testing.assert_allclose(out.logp, np.asarray(logp) * out.mask, **close(rtol=1e-5, atol=1e-5))
