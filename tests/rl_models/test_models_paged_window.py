"""A model mixing windowed and global layers (Gemma 3) on the paged engine: its global layers keep
the paged KV, its windowed layers a W-slot ring per sequence in the engine's state rows
(rl_models.paged_window), and the engine generates token for token what the full forward pass
predicts, with the learner's log-probs, through preemption, a retained two-turn session, weights
that change mid-rollout and replicas on a mesh; gpt-oss (alternating windowed and full layers,
a mixture of experts) records its routing beside its rings.

The fixture (tests/fixtures/hf/gemma3_text): 6 layers, the first 5 windowed (4 slots), 2 kv heads
of 16. Prompts of up to 14 tokens and 12 new tokens against 8-token prefill chunks: a prompt's
prefix runs in one or two chunks, each longer than the window. The ring's own arithmetic is
checked in the fast tier against a dense windowed attention; the engine's tests compile its
programs (3-20 s each on CPU) and run e2e (the fast tier's Gemma 3 engine tests are in
tests/rl_core/test_core_engine_families.py).
"""

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from simulated_devices import run_on_simulated_devices

from rl_core.policy.logprobs import scoring_inputs
from rl_core.rollout.backend import Requests
from rl_core.rollout.sampler import GREEDY, SamplingParams
from rl_core.rollout.scheduler import pages_for_one
from rl_models import PAGED_TRANSFORMER
from rl_models.hf import load_hf_model
from rl_models.paged_window import ring_attention, ring_spec, windowed_layers
from engines import full_forward_greedy
from state_rows import (SMALL, T, check_retained_session, check_small_pools, check_weight_switch, fuzz_engine,
                        learner_logprobs, prompts, small_engine)
from tolerances import close

HF = Path(__file__).resolve().parents[1] / "fixtures" / "hf"


@pytest.fixture(scope="module")
def gemma3():
    return load_hf_model(HF / "gemma3_text")


# -- the ring (no engine) ---------------------------------------------------------------------

H, K, DH, L = 4, 2, 8, 15


def dense_windowed(q, k, v, window, sinks=None):
    """Position i's attention over positions max(0, i - window + 1)..i, written out (float64)."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    out = np.zeros_like(q)
    for i in range(L):
        for head in range(H):
            j = np.arange(max(0, i - window + 1), i + 1)
            s = k[j, head // (H // K)] @ q[i, head] / np.sqrt(DH)
            top = s.max() if sinks is None else max(s.max(), sinks[head])
            p = np.exp(s - top)
            total = p.sum() + (0.0 if sinks is None else np.exp(sinks[head] - top))
            out[i, head] = p @ v[j, head // (H // K)] / total
    return out


@pytest.mark.parametrize("sinks", [None, np.array([0.5, -1.0, 2.0, 0.0], np.float32)], ids=["plain", "sinks"])
@pytest.mark.parametrize("slots,window", [(4, 4), (16, 100)], ids=["ring-of-the-window", "ring-of-the-sequence"])
def test_a_ring_attends_as_a_dense_window_through_chunks_longer_than_it(slots, window, sinks):
    """One sequence of 15 tokens in row 2 of 3: chunks of 6 (longer than a 4-slot ring), 1 and 4
    tokens, each padded to 8 (padding: row 0, position 0), then 4 decoding steps beside an inactive
    slot (row 0): every real query's output is the dense window's, and the ring ends holding the
    last positions' keys in slots p mod its size. A ring as long as the sequence (16 slots) serves
    a window longer than both (100: the whole sequence)."""
    q, k, v = (jax.random.normal(jax.random.key(i), shape) for i, shape in
               enumerate([(L, H, DH), (L, K, DH), (L, K, DH)]))
    want = dense_windowed(q, k, v, window, sinks)
    rings = (jnp.full((1, 3, slots, K, DH), 7.0), jnp.full((1, 3, slots, K, DH), 7.0))  # stale rows: never read
    step = jax.jit(ring_attention, static_argnames=("layer", "window", "sequence"))
    got = np.zeros_like(want)
    for start, n in ((0, 6), (6, 1), (7, 4)):
        pad = 8 - n
        span = np.arange(start, start + n)
        idx = np.concatenate([span, np.zeros(pad, int)])
        rows = np.asarray([2] * n + [0] * pad, np.int32)
        positions = np.asarray(list(span) + [0] * pad, np.int32)
        out, rings = step(q[idx], k[idx], v[idx], rings, layer=0, rows=rows, positions=positions, window=window,
                          sequence=True, sinks=sinks)
        got[span] = np.asarray(out)[:n]
    for p in range(11, L):
        idx = np.asarray([p, 0])
        out, rings = step(q[idx], k[idx], v[idx], rings, layer=0, rows=np.asarray([2, 0], np.int32),
                          positions=np.asarray([p, 0], np.int32), window=window, sequence=False, sinks=sinks)
        got[p] = np.asarray(out)[0]
    np.testing.assert_allclose(got, want, **close(atol=1e-5))
    for p in range(max(0, L - slots), L):
        np.testing.assert_array_equal(rings[0][0, 2, p % slots], k[p])
        np.testing.assert_array_equal(rings[1][0, 2, p % slots], v[p])


def test_a_chunk_holds_a_continuing_sequence_then_fresh_ones_each_in_its_own_ring():
    """Sequence A (row 1) prefilled 9 tokens, then a chunk of 16: A's last 6 tokens, sequence B's
    5 (row 2, from position 0), sequence C's 3 (row 3), 2 of padding; a 4-slot ring. Each real
    query's output is its own sequence's dense window (A's reading its ring for positions before
    the chunk, B and C nothing of A's), and each ring ends holding its sequence's last 4 keys."""
    window = 4
    q, k, v = (jax.random.normal(jax.random.key(i), shape) for i, shape in
               enumerate([(3, L, H, DH), (3, L, K, DH), (3, L, K, DH)]))
    want = [dense_windowed(q[s], k[s], v[s], window) for s in range(3)]
    rings = (jnp.full((1, 4, window, K, DH), 7.0), jnp.full((1, 4, window, K, DH), 7.0))
    step = jax.jit(ring_attention, static_argnames=("layer", "window", "sequence"))
    first = np.arange(9)  # A alone, as a chunk of its own
    _, rings = step(q[0][first], k[0][first], v[0][first], rings, layer=0, rows=np.full(9, 1, np.int32),
                    positions=first.astype(np.int32), window=window, sequence=True)
    parts = [(0, np.arange(9, 15)), (1, np.arange(5)), (2, np.arange(3))]  # (sequence, positions)
    seq = np.concatenate([np.full(len(pos), s) for s, pos in parts] + [np.zeros(2, int)])
    pos = np.concatenate([pos for _, pos in parts] + [np.zeros(2, int)])
    rows = np.concatenate([np.full(len(p), s + 1) for s, p in parts] + [np.zeros(2, int)]).astype(np.int32)
    out, rings = step(q[seq, pos], k[seq, pos], v[seq, pos], rings, layer=0, rows=rows,
                      positions=pos.astype(np.int32), window=window, sequence=True)
    out = np.asarray(out)
    for i in range(14):
        np.testing.assert_allclose(out[i], want[seq[i]][pos[i]], **close(atol=1e-5))
    for s, last in ((0, 15), (1, 5), (2, 3)):
        for p in range(max(0, last - window), last):
            np.testing.assert_array_equal(rings[0][0, s + 1, p % window], k[s, p])
            np.testing.assert_array_equal(rings[1][0, s + 1, p % window], v[s, p])


def test_only_a_model_mixing_windowed_and_global_layers_keeps_rings(gemma3):
    """Gemma 3's fixture: 5 windowed layers of 6 keep rings of 4 slots; a model with no window or
    a window on every layer (Mistral: its pages are freed behind the window instead) keeps none."""
    assert windowed_layers(gemma3.config) == (True,) * 5 + (False,)
    keys, values = ring_spec(gemma3)
    assert keys.shape == values.shape == (5, 4, 2, 16)  # [windowed layers, W, kv heads, head dim]
    assert ring_spec(gemma3, max_tokens=3)[0].shape[1] == 3  # no sequence longer than 3: a ring of 3
    assert PAGED_TRANSFORMER.cache_spec(gemma3)[0] == 1  # the pool: the global layer only
    assert ring_spec(load_hf_model(HF / "mistral")) is None and ring_spec(load_hf_model(HF / "qwen3")) is None


# -- the engine ----------------------------------------------------------------------------------


@pytest.mark.e2e
def test_paged_engine_keeps_global_pages_and_window_sized_rings(gemma3):
    """Greedy tokens are the full forward's; every row of a prompt longer than the window. The
    pool holds one layer (the global one) at full length, the state pool 5 layers of 4 slots per
    sequence; retained sequences keep their global pages and one ring each; nothing leaks."""
    tokens, mask = prompts()
    engine = small_engine(gemma3)
    handles = engine.new_sessions(4)
    out = engine.generate(Requests(tokens, mask, sessions=handles), GREEDY, jax.random.key(0))
    np.testing.assert_array_equal(out.tokens, full_forward_greedy(gemma3, tokens, mask, out.tokens))
    assert engine.pages[0].shape[:3] == (1, 1, engine.settings.pool_pages)  # [R, global layers, pages]
    assert engine.states[0].shape == (1, 5, 2 * SMALL["slots"] + 2, 4, 2, 16)  # [R, windowed layers, rows, W, ...]
    # each held sequence: its prompt and every new token but the last, at full length in the global pool
    assert engine.pools[0].in_use == sum(-(-(int(n) + T - 1) // 4) for n in mask.sum(1))
    assert engine.state_pools[0].in_use == 4  # and one ring each, whatever its length
    engine.release()
    assert engine.pools[0].in_use == 0 and engine.state_pools[0].in_use == 0


@pytest.mark.e2e
def test_sampled_logprobs_equal_the_learner_pass(gemma3):
    """Two samples a prompt, each copying its prompt's rings, at temperature 0.7."""
    tokens, mask = prompts()
    out = small_engine(gemma3).generate(Requests(tokens, mask, 2), SamplingParams(temperature=0.7), jax.random.key(5))
    assert len({tuple(r) for r in out.tokens}) == 8
    want = learner_logprobs(gemma3, np.repeat(tokens, 2, 0), np.repeat(mask, 2, 0), out.tokens, temperature=0.7)
    np.testing.assert_allclose(out.logp, want * out.mask, **close(rtol=1e-5, atol=1e-5))


@pytest.mark.e2e
def test_preempted_sequences_restart_from_their_prompts_rings(gemma3):
    """A pool of 12 pages for two slots: samples are preempted mid-sequence (pages and rings
    freed) and restarted; a state pool of 3 rows (a prompt's ring and one sample's): one sample
    runs at a time. The same draws as a roomy engine, the learner's log-probs, nothing leaked."""
    tokens, mask = prompts()
    assert pages_for_one(4, 14, T) <= 11 < 2 * pages_for_one(4, 14, T)
    engine = small_engine(gemma3, slots=2, num_pages=12)
    out = engine.generate(Requests(tokens, mask, 2), SamplingParams(temperature=1.0), jax.random.key(2))
    assert engine.preemptions > 0
    roomy = small_engine(gemma3).generate(Requests(tokens, mask, 2), SamplingParams(temperature=1.0), jax.random.key(2))
    np.testing.assert_array_equal(out.tokens, roomy.tokens)  # each token keyed by its completion: the same draws
    scarce = small_engine(gemma3, slots=2, state_rows=3)
    few_rows = scarce.generate(Requests(tokens, mask, 2), SamplingParams(temperature=1.0), jax.random.key(2))
    np.testing.assert_array_equal(few_rows.tokens, roomy.tokens)
    want = learner_logprobs(gemma3, np.repeat(tokens, 2, 0), np.repeat(mask, 2, 0), out.tokens)
    np.testing.assert_allclose(out.logp, want, **close(rtol=1e-5, atol=1e-5))
    for e in (engine, scarce):
        assert e.pools[0].in_use == 0 and e.state_pools[0].in_use == 0


@pytest.mark.e2e
def test_a_retained_session_continues_from_its_held_rings(gemma3):
    """Turn 2 sends turn 1's prompt, its completion and an observation under the same handles: the
    engine prefills only the observation (its windowed layers reading the last 4 slots of the held
    rings) and generates what the full forward predicts; a prompt that departs from the held
    tokens is prefilled whole."""
    check_retained_session(gemma3, small_engine(gemma3, max_prompt_tokens=32), atol=1e-5)


@pytest.mark.e2e
@pytest.mark.parametrize("mode", ["continue", "recompute"])
def test_partial_rollouts_switch_weights_mid_rollout(gemma3, mode):
    """New weights published after call 2: the tokens before are the old weights' alone; with
    `recompute` the tokens after are the new weights' own forward (every ring and page recomputed
    from the tokens), with `continue` they differ from it (the old weights' keys stay)."""
    check_weight_switch(gemma3, lambda model, mode: small_engine(model, partial=mode), mode, atol=1e-5)


@pytest.mark.e2e
def test_a_mixed_mixture_of_experts_records_the_routing_that_sampled_each_token():
    """gpt-oss (windowed and full layers alternating, sinks, 4 experts, top 2): its windowed layers'
    rings run beside the routed forward, and each token's recorded experts are the ones the full
    scoring pass's routers choose at the position before it."""
    model = load_hf_model(HF / "gpt_oss")
    assert windowed_layers(model.config) == (True, False, True, False)
    tokens, mask = prompts()
    engine = small_engine(model)
    out = engine.generate(Requests(tokens, mask), SamplingParams(temperature=1.0), jax.random.key(3))
    routing = np.asarray(out.routing)
    assert routing.shape == (4, T, 4, 2)  # [rows, tokens, layers, top k]
    seq, positions, attn, outputs_from = scoring_inputs(jnp.asarray(tokens), jnp.asarray(mask, jnp.float32),
                                                        jnp.asarray(out.tokens))
    _, _, want = jax.jit(lambda m: m.routed(seq, positions, attn, outputs_from=outputs_from))(model)
    np.testing.assert_array_equal(routing, np.moveaxis(np.asarray(want.experts), 0, 2))
    assert engine.pools[0].in_use == 0 and engine.state_pools[0].in_use == 0


@pytest.fixture(scope="module")
def fuzzed(gemma3):
    """One engine for every example (state_rows.fuzz_engine)."""
    return fuzz_engine(gemma3)


@pytest.mark.e2e
@settings(max_examples=30, deadline=None, derandomize=True)
@given(data=st.data())
def test_any_page_and_ring_pool_that_fits_one_completion_gives_the_roomy_completions(fuzzed, data):
    """The scheduler under random small host pools of pages and of ring rows (the device pools
    stay roomy; the host ones limit what it hands out), prompts of 1 to 14 tokens (most longer
    than the window), 1 to 3 samples each and EOS-driven lengths: the completions of a roomy
    engine, and every page and row free."""
    check_small_pools(fuzzed, data, longest_prompt=14)


@pytest.mark.multidevice
def test_replicas_on_a_data_mesh_keep_their_own_rings():
    """2 simulated devices, one replica each (its page pool of the global layer and its rings):
    the one-device engine's completions and log-probs, nothing held afterwards."""
    result = run_on_simulated_devices(Path(__file__).parent / "scripts" / "paged_states_mesh.py", devices=2,
                                      args=("gemma3_text", "data"))
    assert result["replicas"] == 2 and result["pool_shape"][:2] == [2, 1]  # [R, global layers]
    assert result["state_pool_shapes"][0][:4] == [2, 5, 8, 4]  # [R, windowed layers, rows, W]
    assert result["tokens_equal"] and result["logp_max_diff"] < 1e-5
    assert result["rows_in_use"] == [0, 0] and result["pages_in_use"] == [0, 0]


@pytest.mark.multidevice
def test_rings_split_over_tensor_on_their_kv_heads():
    """2 simulated devices on the tensor axis: one replica whose rings, like its page pool, are split
    on their 2 kv heads ([R, layers, rows, W, kv heads, head dim]); the one-device engine's tokens."""
    result = run_on_simulated_devices(Path(__file__).parent / "scripts" / "paged_states_mesh.py", devices=2,
                                      args=("gemma3_text", "tensor"))
    assert result["replicas"] == 1
    assert [spec[1:] for spec in result["state_specs"]] == [[None, None, None, "tensor", None]] * 2
    assert result["tokens_equal"] and result["logp_max_diff"] < 1e-5
    assert result["rows_in_use"] == [0] and result["pages_in_use"] == [0]
