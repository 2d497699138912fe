"""Both rollout engines on Phi-3's block (tests/fixtures/hf/phi3: fused projections read apart,
partial rotary over 12 of 16 head dims, LongRoPE past an original 8 positions, tied embeddings).

LongRoPE takes its short or long factors for a whole call from the call's longest position (as
transformers does per forward). Every prompt here is longer than 8 tokens and each is prefilled in
one call, so every call of both engines, like the full forward, takes the long factors: the
engines generate token for token what the full forward predicts, and the paged engine's log-probs
are the learner's. (A prompt prefilled in chunks within the original context would take the short
factors for its first chunk; the trainer keeps such runs out: TransformerConfig.position_problem.)
"""

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl_core.policy.logprobs import completion_logprobs
from rl_core.policy.tokens import left_pad
from rl_core.rollout.backend import Requests
from rl_core.rollout.sampler import GREEDY, SamplingParams
from rl_models.hf import load_hf_model
from engines import full_forward_greedy, paged_engine, static_engine
from tolerances import close

HF = Path(__file__).resolve().parents[1] / "fixtures" / "hf"
T = 10
SMALL = dict(max_prompt_tokens=16, max_new_tokens=T, page_size=4, slots=3, prefill_chunk=16, steps_per_sync=3)
NO_EOS = (10_000,)


@pytest.fixture(scope="module")
def model():
    model = load_hf_model(HF / "phi3")
    assert model.config.rotary_dim == 12 and model.config.rope_scaling.original_max_position_embeddings == 8
    return model


def prompts():
    rng = np.random.default_rng(0)
    return left_pad([rng.integers(3, 300, n).tolist() for n in (12, 9, 15, 10)], pad_id=0, max_tokens=16)


def test_static_sampler_generates_what_the_full_forward_predicts(model):
    tokens, mask = prompts()
    out = static_engine(model, max_new_tokens=T, eos_ids=NO_EOS).generate(Requests(tokens, mask), GREEDY,
                                                                         jax.random.key(0))
    np.testing.assert_array_equal(np.asarray(out.tokens), full_forward_greedy(model, tokens, mask, out.tokens))


def test_paged_engine_generates_what_the_full_forward_predicts(model):
    tokens, mask = prompts()
    out = paged_engine(model, SMALL, eos_ids=NO_EOS).generate(Requests(tokens, mask), GREEDY, jax.random.key(0))
    np.testing.assert_array_equal(np.asarray(out.tokens), full_forward_greedy(model, tokens, mask, out.tokens))


def test_paged_engine_logprobs_equal_the_learner_pass(model):
    tokens, mask = prompts()
    out = paged_engine(model, SMALL, eos_ids=NO_EOS).generate(Requests(tokens, mask, 2),
                                                              SamplingParams(temperature=0.7), jax.random.key(5))
    logp, _ = jax.jit(lambda p, m, c: completion_logprobs(model, p, m, c, temperature=0.7))(
        np.repeat(tokens, 2, axis=0), np.repeat(mask, 2, axis=0), jnp.asarray(out.tokens))
    np.testing.assert_allclose(out.logp, np.asarray(logp) * out.mask, **close(rtol=1e-5, atol=1e-5))
