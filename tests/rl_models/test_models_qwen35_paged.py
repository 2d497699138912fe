"""Qwen3.5 on the paged engine: its linear-attention layers keep a state row per sequence beside
the paged KV of its attention layer (rl_models.paged_hybrid, rl_core.rollout.scheduler), and the
engine generates token for token what the full forward pass predicts, with the learner's
log-probs, through preemption, a retained two-turn session, weights that change mid-rollout and
random small pools of pages and state rows.

Prompts of 1 to 14 tokens against 8-token prefill chunks: a prompt's prefix runs in one to two
chunks (its state carried between calls in its row), a 1-token prompt starts from a zero state.
The engine's tests are e2e (each compiles the engine's programs: 15-25 s on CPU); the fast tier
checks the linear-attention layer's `hold`, which they rest on.
"""

import dataclasses
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from hypothesis import given, settings
from hypothesis import strategies as st
from simulated_devices import run_on_simulated_devices

from rl_core.rollout.backend import Requests
from rl_core.rollout.sampler import GREEDY, Sampler, SamplingParams
from rl_core.rollout.static import StaticBackend
from rl_models.hf import load_hf_model
from engines import full_forward_greedy
from state_rows import (NO_EOS, SMALL, T, check_retained_session, check_small_pools, check_weight_switch, fuzz_engine,
                        learner_logprobs, prompts, small_engine)
from tolerances import close

HF = Path(__file__).resolve().parents[1] / "fixtures" / "hf"


@pytest.fixture(scope="module")
def qwen35():
    return load_hf_model(HF / "qwen35")


def test_a_linear_attention_layer_holding_its_state_passes_padding_unchanged(qwen35):
    """`GatedDeltaNet(..., hold=True)`, as the engine runs it: a row's tokens past its valid ones
    (a prefill chunk's padding) leave the state that its valid tokens reached, through the chunked
    rule, and an invalid single token (an inactive slot) leaves the state it read."""
    layer = nnx.merge(*nnx.split(qwen35.linear_layers))
    block = nnx.merge(nnx.graphdef(layer), jax.tree.map(lambda a: a[0], nnx.state(layer))).linear_attn
    block.shape = dataclasses.replace(block.shape, chunk_tokens=8)  # one small chunk (the rule's values do not change)
    x = jax.random.normal(jax.random.key(0), (1, 6, 64))
    start = block.init_state(1)
    state = (jax.random.normal(jax.random.key(1), start[0].shape), jax.random.normal(jax.random.key(2), start[1].shape))
    first4 = jnp.arange(6)[None] < 4

    @jax.jit
    def run(state):
        _, want = block(x[:, :4], jnp.ones((1, 4), bool), jnp.zeros((1, 4), bool), state)  # 4 tokens continuing it
        _, got = block(x, first4, jnp.zeros((1, 6), bool), state, hold=True)
        _, loose = block(x, first4, jnp.zeros((1, 6), bool), state)  # without hold the padding decays it
        _, idle = block(x[:, :1], jnp.zeros((1, 1), bool), jnp.ones((1, 1), bool), state, hold=True)
        return want, got, loose, idle

    want, got, loose, idle = run(state)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a, b, **close(atol=1e-5))
    assert np.abs(np.asarray(loose[1]) - np.asarray(want[1])).max() > 1e-3
    for a, b in zip(idle, state, strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.e2e
def test_paged_engine_generates_what_the_full_forward_and_the_static_sampler_do(qwen35):
    tokens, mask = prompts()
    engine = small_engine(qwen35)
    out = engine.generate(Requests(tokens, mask), GREEDY, jax.random.key(0))
    np.testing.assert_array_equal(out.tokens, full_forward_greedy(qwen35, tokens, mask, out.tokens))
    graphdef, state = nnx.split(qwen35)
    static = StaticBackend(Sampler(graphdef, max_new_tokens=T, eos_ids=NO_EOS, pad_id=0))
    static.update_weights(state, 1)
    np.testing.assert_array_equal(out.tokens, static.generate(Requests(tokens, mask), GREEDY, jax.random.key(0)).tokens)
    np.testing.assert_allclose(out.logp, learner_logprobs(qwen35, tokens, mask, out.tokens), **close(atol=1e-4))
    # every state row is back in the pool: 4 prompts and their samples took and returned them
    assert engine.state_pools is not None and engine.state_pools[0].in_use == 0
    assert engine.states[1].shape == (1, 3, 2 * SMALL["slots"] + 2, 4, 16, 16)  # [R, linear layers, rows, Hv, Dk, Dv]
    assert engine.pages[0].shape[1] == 1  # the KV pool holds the one attention layer only


@pytest.mark.e2e
def test_sampled_logprobs_equal_the_learner_pass(qwen35):
    """Two samples a prompt, each copying its prompt's state, at temperature 0.7."""
    tokens, mask = prompts()
    out = small_engine(qwen35).generate(Requests(tokens, mask, 2), SamplingParams(temperature=0.7), jax.random.key(5))
    assert len({tuple(r) for r in out.tokens}) == 8
    want = learner_logprobs(qwen35, np.repeat(tokens, 2, 0), np.repeat(mask, 2, 0), out.tokens, temperature=0.7)
    np.testing.assert_allclose(out.logp, want * out.mask, **close(atol=1e-4))


@pytest.mark.e2e
def test_preempted_sequences_restart_from_their_prompts_state(qwen35):
    """A pool of 12 pages for two slots: samples are preempted (their rows freed) and restarted;
    and a state pool of 3 rows (a prompt's and one sample's): one sample runs at a time."""
    tokens, mask = prompts()
    engine = small_engine(qwen35, slots=2, num_pages=12)
    out = engine.generate(Requests(tokens, mask, 2), SamplingParams(temperature=1.0), jax.random.key(2))
    assert engine.preemptions > 0
    roomy = small_engine(qwen35).generate(Requests(tokens, mask, 2), SamplingParams(temperature=1.0), jax.random.key(2))
    np.testing.assert_array_equal(out.tokens, roomy.tokens)  # each token keyed by its completion: the same draws
    scarce = small_engine(qwen35, slots=2, state_rows=3)
    np.testing.assert_array_equal(
        scarce.generate(Requests(tokens, mask, 2), SamplingParams(temperature=1.0), jax.random.key(2)).tokens, roomy.tokens)
    want = learner_logprobs(qwen35, np.repeat(tokens, 2, 0), np.repeat(mask, 2, 0), out.tokens)
    np.testing.assert_allclose(out.logp, want, **close(atol=1e-4))


@pytest.mark.e2e
def test_a_retained_session_continues_from_its_held_state(qwen35):
    """Turn 2 sends turn 1's prompt, its completion and an observation under the same handles: the
    engine prefills only the observation (from the held pages and state row) and generates what
    the full forward predicts; a prompt that departs from the held tokens is prefilled whole."""
    check_retained_session(qwen35, small_engine(qwen35, max_prompt_tokens=32), atol=1e-4)


@pytest.mark.e2e
@pytest.mark.parametrize("mode", ["continue", "recompute"])
def test_partial_rollouts_switch_weights_mid_rollout(qwen35, mode):
    """New weights published after call 2: the tokens before are the old weights' alone; with
    `recompute` the tokens after are the new weights' own forward (every state and key recomputed
    from the tokens), with `continue` they differ from it (the old weights' states continue)."""
    check_weight_switch(qwen35, lambda model, mode: small_engine(model, partial=mode), mode, atol=1e-4)


@pytest.fixture(scope="module")
def fuzzed(qwen35):
    """One engine for every example (state_rows.fuzz_engine)."""
    return fuzz_engine(qwen35)


@pytest.mark.e2e
@settings(max_examples=30, deadline=None, derandomize=True)
@given(data=st.data())
def test_any_page_and_state_pool_that_fits_one_completion_gives_the_roomy_completions(fuzzed, data):
    """The scheduler under random small host pools of pages and of state rows (the device pools
    stay roomy; the host ones limit what it hands out), prompts of 1 to 10 tokens, 1 to 3 samples
    each and EOS-driven lengths: the completions of a roomy engine, and every page and row free."""
    check_small_pools(fuzzed, data, longest_prompt=10)


@pytest.mark.multidevice
def test_replicas_on_a_data_mesh_keep_their_own_state_rows():
    """2 simulated devices, one replica each (its page pool and its state rows): the one-device
    engine's completions and log-probs."""
    result = run_on_simulated_devices(Path(__file__).parent / "scripts" / "paged_states_mesh.py", devices=2,
                                      args=("qwen35",))
    assert result["replicas"] == 2 and result["state_pool_shapes"][1][:3] == [2, 3, 8]  # [R, linear layers, rows]
    assert result["tokens_equal"] and result["logp_max_diff"] < 1e-5
    assert result["rows_in_use"] == [0, 0]
