"""The decode cache's window-sized rings (rl_models.rings, `Transformer.init_decode_cache`): a
windowed layer keeps min(W, S) slots, and a model run over it computes what it computes over the
full-length cache, prefill, decoding past several wraps and calls of several tokens alike.

Fixtures: tiny Gemma 3 (five 4-slot windowed layers to one global) and Mistral (two 5-slot
windowed layers), unrolled (CPU's default) and scanned (accelerators')."""

import dataclasses
from pathlib import Path

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flax import nnx

from rl_models import Transformer
from rl_models.hf import load_hf_config, load_hf_model
from rl_models.rings import RingKV, held_slots, key_mask, repeating_period, write_call

HF = Path(__file__).resolve().parents[1] / "fixtures" / "hf"
B, K, DH = 2, 2, 16  # rows; both fixtures' KV heads and head size


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_held_slots_name_the_latest_slot_of_each_entry(jit):
    held = jax.jit(held_slots, static_argnums=1) if jit else held_slots  # the slot traced, as the sampler's is
    # a 4-slot ring after slot 9: entries 0..3 hold 8, 9, 6, 7 (9 - (9 - j) mod 4)
    np.testing.assert_array_equal(held(9, 4), [8, 9, 6, 7])
    # after slot 1: entries 2 and 3 were never written (negative)
    np.testing.assert_array_equal(held(1, 4), [0, 1, -2, -1])


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_write_call_keeps_the_last_ring_slots_of_a_call(jit):
    write = jax.jit(write_call) if jit else write_call
    ring = jnp.full((1, 1, 4, 1), -1.0)
    new = jnp.arange(10.0).reshape(1, 1, 10, 1)  # slots 3..12 hold 0..9
    # slot s goes to entry s mod 4: 12 -> 0 (9), 9 -> 1 (6), 10 -> 2 (7), 11 -> 3 (8)
    np.testing.assert_array_equal(write(ring, new, 3)[0, 0, :, 0], [9, 6, 7, 8])
    # two slots (5, 6) written: entries 1 and 2 take them, 0 and 3 keep theirs
    np.testing.assert_array_equal(write(ring, new[:, :, :2], 5)[0, 0, :, 0], [-1, 0, 1, -1])


def test_key_mask_reads_the_callers_mask_by_slot_within_the_window():
    mask = jnp.asarray([[[False, True, True, True, True, True]]])  # slot 0 is padding
    # query at slot 5, window 3: keys at slots 4, 5, 2, 3, 0 (2 is too far; 0 is padding; -1 empty)
    got = key_mask(mask, jnp.asarray([4, 5, 2, 3, 0, -1]), jnp.asarray([5]), 3)
    np.testing.assert_array_equal(got[0, 0], [True, True, False, True, False, False])


def test_repeating_period_of_the_layer_kinds():
    assert repeating_period((True,) * 5 + (False,) + (True,) * 5 + (False,) + (True,) * 2) == 6  # Gemma 3, 14 layers
    assert repeating_period((True, True)) == 1
    assert repeating_period((True, False)) == 2


@pytest.mark.parametrize("scan", [False, True], ids=["unrolled", "scanned"])
def test_decode_cache_is_window_sized_for_windowed_layers(scan):
    gemma = load_hf_model(HF / "gemma3_text", scan_layers=scan)
    mistral = load_hf_model(HF / "mistral", scan_layers=scan)
    g, m = gemma.init_decode_cache(B, 30), mistral.init_decode_cache(B, 30)
    if scan:
        assert isinstance(g, RingKV) and isinstance(m, RingKV) and m.full is None
        chex.assert_shape(g.full, (1, B, K, 30, DH))  # the one global layer: every slot
        chex.assert_shape(g.ring, (5, B, K, 4, DH))  # five windowed layers: their 4-slot window
        chex.assert_shape(m.ring, (2, B, K, 5, DH))
    else:
        for keys_or_values in (*g, *m):  # (k, v) of one buffer per layer
            assert isinstance(keys_or_values, tuple)
        chex.assert_shape(g[0], ((B, K, 4, DH),) * 5 + ((B, K, 30, DH),))
        chex.assert_shape(m[1], ((B, K, 5, DH),) * 2)
    # a sequence shorter than the window: the ring is the sequence
    assert {x.shape[-2] for x in jax.tree.leaves(mistral.init_decode_cache(B, 3))} == {3}
    # the axes describe the cache: split over rows and KV heads, never over slots
    for model, cache in ((gemma, g), (mistral, m)):
        jax.tree.map(lambda x, names: _check_axes(x, tuple(names)), cache, model.decode_cache_axes())


def _check_axes(x, names):
    assert len(names) == x.ndim and names[-2] == "cache_slots" and {"batch", "kv_heads"} <= set(names)


def _inputs(rng, lengths, p, s):
    """Left-padded prompts [B, p] and the prefill's positions and mask over s slots."""
    tokens = np.zeros((len(lengths), p), np.int32)
    valid = np.zeros((len(lengths), p), bool)
    for i, n in enumerate(lengths):
        tokens[i, p - n:] = rng.integers(3, 300, n)
        valid[i, p - n:] = True
    positions = np.maximum(np.cumsum(valid, axis=1) - 1, 0)
    return tokens, valid, positions


def _gemma_of_8_layers():
    """Gemma 3's pattern past a whole group (five windowed, one global, two windowed: the scan over
    groups, then over the two left), randomly initialised."""
    config = load_hf_config(HF / "gemma3_text", scan_layers=True)
    config = dataclasses.replace(config, num_layers=8, layer_types=(*config.layer_types, *config.layer_types[:2]))
    return Transformer(config, rngs=nnx.Rngs(0))


@pytest.mark.parametrize("name,scan", [pytest.param("gemma3_text", False, marks=pytest.mark.e2e),
                                       pytest.param("gemma3_text", True, marks=pytest.mark.e2e),
                                       pytest.param("gemma3-8-layers", True, marks=pytest.mark.e2e),
                                       ("mistral", False), ("mistral", True)])  # Gemma's layers: seconds
def test_a_model_over_its_rings_computes_what_it_computes_over_the_full_cache(name, scan):
    """Prompts of 11 and 6 tokens (windows 4 and 5) prefilled in two calls (8 slots, then 3 at slot 8:
    the ring's earlier slots and the call's own), then 14 decoding steps (3 wraps of a 4-slot ring):
    every call's hidden states equal the full cache's within float32 rounding (1e-4: six layers)."""
    model = _gemma_of_8_layers() if name == "gemma3-8-layers" else load_hf_model(HF / name, scan_layers=scan)
    p, steps = 11, 14
    s = p + steps
    tokens, valid, positions = _inputs(np.random.default_rng(0), (11, 6), p, s)
    slot_valid = np.zeros((B, s), bool)
    slot_valid[:, :p] = valid
    causal = np.arange(s)[None, :] <= np.arange(p)[:, None]
    mask = causal[None] & slot_valid[:, None, :]

    graphdef, state = nnx.split(model)
    call = jax.jit(lambda state, *args: nnx.merge(graphdef, state)(*args))  # one program per call shape
    first = jax.jit(lambda state, *args: nnx.merge(graphdef, state)(*args, 0))  # the prefill at slot 0 (static)

    def run(cache):
        h, cache = first(state, tokens[:, :8], positions[:, :8], mask[:, :8], cache)
        outs = [h]
        h, cache = call(state, tokens[:, 8:], positions[:, 8:], mask[:, 8:], cache, jnp.int32(8))
        outs.append(h)
        token, pos, valid_now = jnp.argmax(model.logits(h[:, -1]), -1), positions[:, -1] + 1, slot_valid.copy()
        for t in range(steps):  # decoding: one token per call
            valid_now[:, p + t] = True
            step_mask = (valid_now & (np.arange(s) <= p + t))[:, None, :]
            h, cache = call(state, token[:, None].astype(jnp.int32), pos[:, None], step_mask, cache, jnp.int32(p + t))
            outs.append(h)
            token, pos = jnp.argmax(model.logits(h[:, 0]), -1), pos + 1
        return outs, cache

    rings, ring_cache = run(model.init_decode_cache(B, s))
    full, _ = run(model.init_cache(B, s))
    window = model.config.sliding_window
    assert window in {x.shape[-2] for x in jax.tree.leaves(ring_cache)} and window < p < s
    # padding queries (which attend to nothing) are never read: real positions only
    real = [valid[:, :8], valid[:, 8:]] + [np.ones((B, 1), bool)] * steps
    for got, want, keep in zip(rings, full, real, strict=True):
        np.testing.assert_allclose(np.asarray(got)[keep], np.asarray(want)[keep], atol=1e-4, rtol=1e-4)


def test_a_cache_of_the_wrong_slots_is_refused_with_one_line():
    model = load_hf_model(HF / "gemma3_text", scan_layers=False)  # windows of 4; a cache per layer (a TPU's
    tokens, positions = jnp.ones((B, 1), jnp.int32), jnp.zeros((B, 1), jnp.int32)  # default scans: below)
    rings = model.init_decode_cache(B, 30)
    with pytest.raises(ValueError, match=r"attention_mask of shape \(2, 1, 30\)"):  # the global layer's 30 slots
        model(tokens, positions, jnp.ones((B, 1, 20), bool), rings, 5)
    ks, vs = rings
    wrong = (ks[:1] + (jnp.zeros((B, K, 3, DH)),) + ks[2:], vs)  # layer 1: 3 slots, under its window
    with pytest.raises(ValueError, match="cache layer 1 holds 3 slots: .* min\\(window, 30\\) = 4"):
        model(tokens, positions, jnp.ones((B, 1, 30), bool), wrong, 5)
    scanned = load_hf_model(HF / "gemma3_text", scan_layers=True)
    with pytest.raises(ValueError, match="cache has 0 global and 2 windowed layers, the model 1 and 5"):
        scanned(tokens, positions, jnp.ones((B, 1, 30), bool), load_hf_model(HF / "mistral", scan_layers=True)
                .init_decode_cache(B, 30), 5)
