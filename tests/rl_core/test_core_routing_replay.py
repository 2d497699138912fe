"""Routing replay (docs/mixture-of-experts.md): the rollout engines record, per generated token, the
experts each layer's router chose at the position that sampled it; the learner's passes replay them.

The tiny Qwen3-MoE fixture (8 experts, 2 per token, 2 layers) against the full forward pass."""

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rl_core.policy.logprobs import completion_logprobs, scoring_inputs
from rl_core.policy.tokens import left_pad
from rl_core.rollout.backend import Requests
from rl_core.rollout.paged import EngineSettings, PagedBackend
from rl_core.rollout.sampler import Sampler, SamplingParams
from rl_core.rollout.static import StaticBackend
from rl_models import PAGED_TRANSFORMER
from rl_models.hf import load_hf_model

HF = Path(__file__).resolve().parents[1] / "fixtures" / "hf"
T = 8
EOS = tuple(range(6, 60))  # a sixth of the vocabulary: some completions end early
SAMPLING = SamplingParams(temperature=1.0)


@pytest.fixture(scope="module")
def moe():
    return load_hf_model(HF / "qwen3_moe")


def prompts(lengths=(3, 9, 6), seed=0):
    rng = np.random.default_rng(seed)
    return left_pad([rng.integers(60, 300, n).tolist() for n in lengths], pad_id=0, max_tokens=10)


def static(model) -> StaticBackend:
    graphdef, state = nnx.split(model)
    backend = StaticBackend(Sampler(graphdef, max_new_tokens=T, eos_ids=EOS, pad_id=0))
    backend.update_weights(state, 1)
    return backend


def paged(model, **overrides) -> PagedBackend:
    graphdef, state = nnx.split(model)
    settings = dict(max_prompt_tokens=10, max_new_tokens=T, page_size=4, slots=3, prefill_chunk=8, steps_per_sync=3)
    engine = PagedBackend(graphdef, EngineSettings(**(settings | overrides)), paging=PAGED_TRANSFORMER,
                          eos_ids=EOS, pad_id=0)
    engine.update_weights(state, 1)
    return engine


def full_forward_routing(model, tokens, mask, completions):
    """[B, T, layers, k]: the experts the full scoring pass's routers choose at the position before
    each completion token (the prompt's last, then each completion token but the last)."""
    seq, positions, attn, outputs_from = scoring_inputs(jnp.asarray(tokens), jnp.asarray(mask, jnp.float32),
                                                        jnp.asarray(completions))
    _, _, routing = jax.jit(lambda m: m.routed(seq, positions, attn, outputs_from=outputs_from))(model)
    return np.asarray(jnp.moveaxis(routing.experts, 0, 2))


@pytest.mark.parametrize("engine", ["static", pytest.param("paged", marks=pytest.mark.e2e)])
def test_engines_record_the_routing_of_the_step_that_sampled_each_token(moe, engine):
    """Every real token's record is what the full forward pass routes at that position (both layers,
    both choices, in the router's order); -1 past each completion's end."""
    tokens, mask = prompts()
    backend = static(moe) if engine == "static" else paged(moe)
    out = backend.generate(Requests(tokens, mask, 2), SAMPLING, jax.random.key(3))
    routing = np.asarray(out.routing)
    assert routing.shape == (6, T, 2, 2) and routing.dtype == np.int32
    real = np.asarray(out.mask) > 0
    assert real.sum() > 12 and not real.all()  # some rows end early at the EOS
    want = full_forward_routing(moe, np.repeat(tokens, 2, axis=0), np.repeat(mask, 2, axis=0), out.tokens)
    np.testing.assert_array_equal(routing[real], want[real])
    assert (routing[~real] == -1).all()


def test_a_dense_model_records_no_routing():
    model = load_hf_model(HF / "qwen3")
    tokens, mask = prompts()
    assert static(model).generate(Requests(tokens, mask), SAMPLING, jax.random.key(0)).routing is None
