"""Sliding-window layers decode over their window only (the static sampler's cache path).

Prefill a 9-token prompt into a 16-slot cache, then decode the token at slot 9: a windowed
layer (Mistral's window is 5, Gemma 3's 4) never reads slots before 9 - W + 1, so NaN written
there leaves the step's output unchanged; a full-attention layer (Gemma 3's sixth) reads
every slot, so there only its own cache stays clean.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rl_models import Transformer
from rl_models.hf import load_hf_model


def _decode_step(model, cache_edit):
    prompt = jnp.asarray([[5, 17, 42, 99, 130, 255, 8, 13, 21]], jnp.int32)
    p, s = prompt.shape[1], 16
    causal = jnp.arange(s)[None, :] <= jnp.arange(p)[:, None]
    _, cache = model(prompt, jnp.arange(p)[None], causal[None], model.init_cache(1, s), 0)
    cache = cache_edit(cache)
    mask = (jnp.arange(s) <= p)[None, None, :]
    hidden, _ = jax.jit(lambda m, c: m(jnp.asarray([[77]]), jnp.asarray([[p]]), mask, c, p))(model, cache)
    return np.asarray(hidden)


def _spoiled(model, before):
    """A cache edit writing NaN into slots 0..before - 1 of each windowed layer."""
    windowed = model.config.windowed()

    def edit(cache):
        if isinstance(cache[0], tuple):  # one buffer per layer
            return tuple(tuple(c.at[:, :, :before].set(jnp.nan) if w else c for c, w in zip(kv, windowed, strict=True))
                         for kv in cache)
        slots = jnp.arange(cache[0].shape[3]) < before  # stacked: [layers, B, K, S, Dh]
        spoil = jnp.asarray(windowed)[:, None, None, None, None] & slots[None, None, None, :, None]
        return tuple(jnp.where(spoil, jnp.nan, c) for c in cache)

    return edit


@pytest.mark.parametrize(("name", "scan"), [("mistral", False), ("mistral", True), ("gemma3_text", False)],
                         ids=["mistral-unrolled", "mistral-scanned", "gemma3-unrolled"])
def test_decoding_reads_only_the_window(hf_fixtures, name, scan):
    loaded = load_hf_model(hf_fixtures / name)
    model = Transformer(dataclasses.replace(loaded.config, scan_layers=scan), rngs=nnx.Rngs(0))
    nnx.update(model, nnx.state(loaded))
    window = model.config.sliding_window
    clean = _decode_step(model, lambda c: c)
    spoiled = _decode_step(model, _spoiled(model, 9 - window + 1))
    assert np.isfinite(clean).all()
    np.testing.assert_array_equal(spoiled, clean)
    # one slot more is inside the window: it is read, and NaN there reaches the output
    assert np.isnan(_decode_step(model, _spoiled(model, 9 - window + 2))).any()
