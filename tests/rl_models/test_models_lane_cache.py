"""The lane-packed decode cache of a scanned model (rl_models.block.LaneKV): heads narrower than 128
lanes cached side by side, [layers, B, S, K * Dh], read by `attend_lanes`, the keys rotated by
`rotate_lanes`. Each gives the numbers of the heads' layout it replaces."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rl_models import Transformer, TransformerConfig
from rl_models import attention as attention_lib
from rl_models.attention import attend
from rl_models.block import LaneKV, attend_lanes, lane_packed
from rl_models.rope import rope_cos_sin, rotate, rotate_lanes

from tolerances import close

V = 50
# (query heads, KV heads, head dim): one 128-lane group of 2 heads (Qwen2.5-0.5B's), one of 4 heads of
# 32, and four groups of 2 (Llama 3.2 1B's 8 KV heads of 64)
GEOMETRIES = [(4, 2, 64), (8, 4, 32), (16, 8, 64)]


def config(heads: int, kv_heads: int, head_dim: int, **overrides) -> TransformerConfig:
    return TransformerConfig.tiny(V, hidden_size=heads * head_dim, num_heads=heads, num_kv_heads=kv_heads,
                                  head_dim=head_dim, attention_bias=True, **overrides)


@pytest.mark.parametrize(("heads", "kv_heads", "head_dim"), GEOMETRIES)
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_rotate_lanes_is_rotate_number_for_number(heads, kv_heads, head_dim, dtype):
    del heads
    x = jax.random.normal(jax.random.key(0), (3, 5, kv_heads, head_dim), jnp.float32).astype(dtype) * 3
    positions = jnp.arange(15, dtype=jnp.int32).reshape(3, 5) * 7
    inv_freq = 1.0 / (10000.0 ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim))
    cos, sin = rope_cos_sin(positions, inv_freq)
    np.testing.assert_array_equal(np.asarray(rotate_lanes(x, cos, sin), np.float32),
                                  np.asarray(rotate(x, cos, sin), np.float32))


def test_rotate_lanes_of_a_partial_rotary_is_rotate():
    x = jax.random.normal(jax.random.key(1), (2, 3, 2, 64))
    inv_freq = 1.0 / (10000.0 ** (np.arange(0, 32, 2, dtype=np.float32) / 32))  # the first 32 dims turn
    cos, sin = rope_cos_sin(jnp.arange(6, dtype=jnp.int32).reshape(2, 3), inv_freq)
    np.testing.assert_array_equal(rotate_lanes(x, cos, sin), rotate(x, cos, sin))


@pytest.mark.parametrize(("heads", "kv_heads", "head_dim"), GEOMETRIES)
@pytest.mark.parametrize(("softcap", "with_sinks"), [(None, False), (5.0, False), (None, True)])
def test_attend_lanes_is_attend_over_the_heads_layout(heads, kv_heads, head_dim, softcap, with_sinks):
    """One query a row over 9 slots: row 0 sees them all, row 1 the last 4 (a left-padded prompt),
    row 2 none (its output is finite, as `attend` gives); with gpt-oss's sinks, one per query head."""
    b, s = 3, 9
    kq, kk, kv = jax.random.split(jax.random.key(2), 3)
    q = jax.random.normal(kq, (b, 1, heads, head_dim))
    k = jax.random.normal(kk, (b, kv_heads, s, head_dim))
    v = jax.random.normal(kv, (b, kv_heads, s, head_dim))
    mask = jnp.stack([jnp.ones(s, bool), jnp.arange(s) >= 5, jnp.zeros(s, bool)])[:, None, :]
    lanes = [x.transpose(0, 2, 1, 3).reshape(b, s, kv_heads * head_dim) for x in (k, v)]
    sinks = jnp.linspace(-1.0, 2.0, heads) if with_sinks else None
    got = attend_lanes(q, *lanes, mask, None, softcap, sinks)
    want = attend(q, k, v, mask, None, sinks, softcap)
    assert got.shape == want.shape == (b, 1, heads * head_dim)
    np.testing.assert_allclose(got, want, **close(rtol=1e-5, atol=1e-6))
    assert bool(jnp.all(jnp.isfinite(got)))


@pytest.mark.parametrize(("heads", "kv_heads", "head_dim"), GEOMETRIES)
def test_a_scanned_model_keeps_narrow_heads_lane_packed_and_decodes_as_the_heads_layout(heads, kv_heads, head_dim,
                                                                                       greedy_generate):
    """scan_layers=True (the accelerators' default) gives a `LaneKV` [layers, B, S, K * Dh]; its greedy
    tokens and each step's hidden states are those of the same model unrolled (one [B, K, S, Dh] a
    layer), and those of the scanned model with `DECODE_ATTENTION = "masked"` (the heads' layout)."""
    prompt = jnp.array([[0, 0, 5, 9, 3, 7], [1, 2, 3, 4, 5, 6]])
    prompt_mask = jnp.array([[0, 0, 1, 1, 1, 1], [1] * 6])
    tokens, caches = {}, {}
    old = attention_lib.DECODE_ATTENTION
    try:
        for name, scan, way in (("unrolled", False, "lanes"), ("lanes", True, "lanes"), ("masked", True, "masked")):
            attention_lib.DECODE_ATTENTION = way
            model = Transformer(config(heads, kv_heads, head_dim, scan_layers=scan), rngs=nnx.Rngs(0))
            caches[name] = model.init_cache(2, 12)
            tokens[name] = greedy_generate(model, prompt, prompt_mask, 6, [V - 1], 0)
            if name == "lanes":
                assert lane_packed(model.config)
                decode_hidden = _decode_hidden(model, prompt, prompt_mask)
            elif name == "masked":
                assert not lane_packed(model.config)
                np.testing.assert_allclose(decode_hidden, _decode_hidden(model, prompt, prompt_mask),
                                           **close(rtol=1e-5, atol=1e-5))
    finally:
        attention_lib.DECODE_ATTENTION = old
    assert isinstance(caches["lanes"], LaneKV)
    assert caches["lanes"].k.shape == caches["lanes"].v.shape == (2, 2, 12, kv_heads * head_dim)
    assert not isinstance(caches["masked"], LaneKV) and caches["masked"][0].shape == (2, 2, kv_heads, 12, head_dim)
    np.testing.assert_array_equal(tokens["lanes"], tokens["unrolled"])
    np.testing.assert_array_equal(tokens["lanes"], tokens["masked"])


def _decode_hidden(model: Transformer, prompt: jax.Array, prompt_mask: jax.Array) -> jax.Array:
    """Hidden states of a prefill of `prompt` and two teacher-forced decode steps (tokens 7 and 8)."""
    b, p = prompt.shape
    slots = p + 2
    valid = jnp.zeros((b, slots), bool).at[:, :p].set(prompt_mask.astype(bool)).at[:, p:].set(True)
    positions = jnp.cumsum(valid, axis=1) - 1
    causal = jnp.arange(slots)[None, :] <= jnp.arange(slots)[:, None]
    mask = causal[None] & valid[:, None, :]
    _, cache = model(prompt, positions[:, :p], mask[:, :p], model.init_cache(b, slots), 0)
    out = []
    for i, token in enumerate((7, 8)):
        t = p + i
        hidden, cache = model(jnp.full((b, 1), token), positions[:, t:t + 1], mask[:, t:t + 1], cache, t)
        out.append(hidden)
    return jnp.concatenate(out, axis=1)
