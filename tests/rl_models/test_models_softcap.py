"""Logit soft-capping (Gemma 2's): attention scores cap * tanh(s / cap) before the mask, in the XLA
path (with its gradient), Splash (`attn_logits_soft_cap`; the Pallas interpreter off TPU) and the
static cache's decoding, and logits cap * tanh(z / cap) wherever the model computes them. Parity
with transformers: the gemma2 fixture (both caps applied) and gemma3_text_softcap (transformers'
Gemma 3 applies the final cap only), in test_models_hf_parity.py; the paged engine's attention in
tests/rl_core/test_core_paged_attention.py."""

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from rl_models import attention
from rl_models.attention import attend
from rl_models.config import TransformerConfig
from rl_models.hf import load_hf_config
from rl_models.transformer import Transformer
from tolerances import close

CAP = 2.0


def qkv(b, l, s, h=4, k=2, dh=16):
    keys = jax.random.split(jax.random.key(0), 3)
    return (jax.random.normal(keys[0], (b, l, h, dh)) * 2, jax.random.normal(keys[1], (b, s, k, dh)) * 2,
            jax.random.normal(keys[2], (b, s, k, dh)))


def by_formula(q, k, v, mask, cap):
    """Plain softmax attention over [B, S, K, Dh] keys with capped scores (numpy's float64)."""
    q, k, v, mask = map(np.asarray, (q, k, v, mask))
    g = q.shape[2] // k.shape[2]
    k, v = np.repeat(k, g, axis=2), np.repeat(v, g, axis=2)
    s = np.einsum("blhd,bshd->bhls", q, k) / math.sqrt(q.shape[-1])
    s = cap * np.tanh(s / cap) if cap else s
    s = np.where(mask[:, None], s, -1e30)  # a row that sees nothing: uniform, never compared
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return np.einsum("bhls,bshd->blhd", p, v).reshape(*q.shape[:2], -1)


def causal_mask(b, l):
    valid = jnp.array([[True] * l, [False] * 3 + [True] * (l - 3)])[:b]
    return jnp.tril(jnp.ones((l, l), bool))[None] & valid[:, None, :]


def test_xla_attention_caps_the_scores_before_the_mask():
    q, k, v = qkv(2, 8, 8)
    mask = causal_mask(2, 8)
    got = attend(q, k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3), mask, softcap=CAP)
    np.testing.assert_allclose(got[mask.any(-1)], by_formula(q, k, v, mask, CAP)[np.asarray(mask.any(-1))],
                               **close(atol=1e-5, rtol=1e-5))
    plain = attend(q, k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3), mask)
    assert float(jnp.abs(plain - got).max()) > 0.1  # the cap bites on these scores


def test_the_capped_attention_gradient_is_the_formula_s():
    q, k, v = qkv(2, 8, 8)
    mask = causal_mask(2, 8)
    weights = jax.random.normal(jax.random.key(3), (2, 8, 64)) * mask.any(-1)[..., None]

    def plain(q, k, v):  # the formula in jnp, differentiated by autodiff
        g = q.shape[2] // k.shape[2]
        kk, vv = jnp.repeat(k, g, axis=2), jnp.repeat(v, g, axis=2)
        s = jnp.einsum("blhd,bshd->bhls", q, kk) / math.sqrt(q.shape[-1])
        s = jnp.where(mask[:, None], CAP * jnp.tanh(s / CAP), jnp.finfo(jnp.float32).min)
        return jnp.einsum("bhls,bshd->blhd", jax.nn.softmax(s, -1), vv).reshape(2, 8, -1)

    def capped(q, k, v):
        return attend(q, k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3), mask, softcap=CAP)

    got = jax.grad(lambda *a: jnp.sum(capped(*a) * weights), argnums=(0, 1, 2))(q, k, v)
    want = jax.grad(lambda *a: jnp.sum(plain(*a) * weights), argnums=(0, 1, 2))(q, k, v)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, atol=1e-5, rtol=1e-5)


def test_splash_takes_the_cap_and_equals_xla_with_gradients():
    q, k, v = qkv(2, 16, 16)
    mask = causal_mask(2, 16)
    real = mask.any(-1)[..., None]
    weights = jax.random.normal(jax.random.key(1), (2, 16, 64)) * real
    interpret = jax.default_backend() != "tpu"
    splash = lambda q, k, v: attention.splash(q, k, v, mask, interpret=interpret, softcap=CAP)  # noqa: E731
    xla = lambda q, k, v: attend(q, k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3), mask, softcap=CAP)  # noqa: E731
    np.testing.assert_allclose(splash(q, k, v) * real, xla(q, k, v) * real, **close(rtol=1e-5, atol=1e-5))
    got = jax.grad(lambda *a: jnp.sum(splash(*a) * weights), argnums=(0, 1, 2))(q, k, v)
    want = jax.grad(lambda *a: jnp.sum(xla(*a) * weights), argnums=(0, 1, 2))(q, k, v)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, **close(rtol=1e-5, atol=1e-5, of="kernel gradients"))


def test_final_logit_softcapping_caps_every_logit():
    config = TransformerConfig.tiny(40, final_logit_softcapping=CAP)
    model = Transformer(config, rngs=nnx.Rngs(0))
    uncapped = Transformer(dataclasses.replace(config, final_logit_softcapping=None), rngs=nnx.Rngs(0))
    hidden = jax.random.normal(jax.random.key(2), (2, 5, 64)) * 10
    want = CAP * np.tanh(np.asarray(uncapped.logits(hidden)) / CAP)
    np.testing.assert_allclose(model.logits(hidden), want, **close(atol=1e-6, rtol=1e-6))
    np.testing.assert_allclose(model.unembedding()(hidden), want, **close(atol=1e-6, rtol=1e-6))  # log-probs' path
    assert float(jnp.abs(model.logits(hidden)).max()) <= CAP


@pytest.mark.parametrize("cap", [0.0, -1.0, True, "30"])
def test_a_cap_must_be_a_positive_number(cap):
    with pytest.raises(ValueError, match=r"final_logit_softcapping=.*: must be None or a number > 0"):
        TransformerConfig.tiny(40, final_logit_softcapping=cap)


def test_the_fixtures_caps_are_read_as_transformers_applies_them(hf_fixtures):
    """gemma2: both caps; gemma3_text_softcap: the final cap only (transformers' Gemma 3 keeps
    attn_logit_softcapping in its config and never applies it). That each moves the logits:
    test_models_hf_parity.py's test_each_family_setting_is_exercised."""
    gemma2, gemma3 = (load_hf_config(hf_fixtures / name) for name in ("gemma2", "gemma3_text_softcap"))
    assert (gemma2.attn_logit_softcapping, gemma2.final_logit_softcapping) == (3.0, 8.0)
    assert (gemma3.attn_logit_softcapping, gemma3.final_logit_softcapping) == (None, 8.0)
