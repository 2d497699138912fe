"""Qwen3.5-MoE on the rollout engines: the paged engine's state rows and paged KV (as Qwen3.5's,
rl_models.paged_hybrid) with the MoE in every layer generate what the full forward pass predicts,
with the learner's log-probs, and both engines record, per generated token, the experts every
layer's router chose at the position that sampled it (routing replay). Each test compiles an
engine's programs: the e2e tier."""

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl_core.policy.logprobs import scoring_inputs
from rl_core.rollout.backend import Requests
from rl_core.rollout.sampler import GREEDY, SamplingParams
from rl_models.hf import load_hf_model
from engines import full_forward_greedy, static_engine
from state_rows import NO_EOS, T, learner_logprobs, prompts, small_engine
from tolerances import close

HF = Path(__file__).resolve().parents[1] / "fixtures" / "hf"


@pytest.fixture(scope="module")
def qwen35_moe():
    return load_hf_model(HF / "qwen35_moe")


def full_forward_routing(model, tokens, mask, completions) -> np.ndarray:
    """[B, T, layers, k]: the experts the full scoring pass's routers choose at the position before
    each completion token."""
    seq, positions, attn, outputs_from = scoring_inputs(jnp.asarray(tokens), jnp.asarray(mask, jnp.float32),
                                                        jnp.asarray(completions))
    _, _, routing = jax.jit(lambda m: m.routed(seq, positions, attn, outputs_from=outputs_from))(model)
    return np.asarray(jnp.moveaxis(routing.experts, 0, 2))


@pytest.mark.e2e
def test_paged_engine_generates_what_the_full_forward_does_with_the_learners_logprobs(qwen35_moe):
    tokens, mask = prompts()
    out = small_engine(qwen35_moe).generate(Requests(tokens, mask), GREEDY, jax.random.key(0))
    np.testing.assert_array_equal(out.tokens, full_forward_greedy(qwen35_moe, tokens, mask, out.tokens))
    np.testing.assert_allclose(out.logp, learner_logprobs(qwen35_moe, tokens, mask, out.tokens), **close(atol=1e-4))


@pytest.mark.e2e
@pytest.mark.parametrize("engine", ["paged", "static"])
def test_engines_record_the_routing_of_the_step_that_sampled_each_token(qwen35_moe, engine):
    """Every token's record is what the full forward pass routes at the position before it: all
    four layers (three linear-attention, one attention), both choices, in the router's order."""
    tokens, mask = prompts()
    backend = small_engine(qwen35_moe) if engine == "paged" else static_engine(qwen35_moe, max_new_tokens=T,
                                                                               eos_ids=NO_EOS)
    out = backend.generate(Requests(tokens, mask), SamplingParams(temperature=1.0), jax.random.key(3))
    routing = np.asarray(out.routing)
    assert routing.shape == (len(tokens), T, 4, 2) and routing.dtype == np.int32  # [rows, tokens, layers, k]
    np.testing.assert_array_equal(routing, full_forward_routing(qwen35_moe, tokens, mask, out.tokens))
