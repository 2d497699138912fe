"""rl_models.paged: the inference copy (adapters merged, compute dtype) and the paged forward."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rl_core.logprobs import sequence_inputs
from rl_core.rollout import attention as attention_lib
from rl_models import Transformer, TransformerConfig, lora

V = 64


def adapted(dtype="float32", quantize=None):
    """A tiny model with LoRA adapters whose B is non-zero (so they change the output)."""
    model = Transformer(TransformerConfig.tiny(V, dtype=dtype), rngs=nnx.Rngs(0))
    if quantize:
        lora.quantize_base(model, quantize)
    lora.add_adapters(model, rank=4, alpha=8.0)
    for i, lin in enumerate(lora.targeted(model, lora.DEFAULT_TARGETS).values()):
        lin.lora_b = lin.lora_b.replace(0.05 * jax.random.normal(jax.random.key(i), lin.lora_b.shape))
    return model


def logits(model, tokens):
    positions, mask = sequence_inputs(jnp.ones_like(tokens), 0)
    return model.logits(model(tokens, positions, mask)[0])


TOKENS = jnp.asarray(np.random.default_rng(0).integers(3, V, (2, 7)), jnp.int32)


@pytest.mark.parametrize("quantize", [None, "int8"])
def test_inference_copy_merges_adapters_and_computes_the_same(quantize):
    model = adapted(quantize=quantize)
    base = Transformer(TransformerConfig.tiny(V), rngs=nnx.Rngs(0))
    copy = jax.jit(lambda s: nnx.split(nnx.merge(*nnx.split(model)[:1], s).inference_copy()))(nnx.split(model)[1])
    copy = nnx.merge(*copy)
    assert not jax.tree.leaves(nnx.state(copy, nnx.LoRAParam))  # merged, not carried
    want = logits(model, TOKENS)
    assert float(jnp.max(jnp.abs(want - logits(base, TOKENS)))) > 1e-2  # the adapters matter
    np.testing.assert_allclose(logits(copy, TOKENS), want, atol=1e-4)  # W + s A B vs (x A) B s: a regrouped sum


def test_inference_copy_is_in_the_compute_dtype():
    copy = adapted(dtype="bfloat16").inference_copy()
    dtypes = {x.dtype for x in jax.tree.leaves(nnx.state(copy))}
    assert dtypes == {jnp.dtype(jnp.bfloat16)}


def test_paged_forward_of_a_whole_sequence_equals_the_plain_forward():
    """One call with every token of two sequences (a prefill chunk) gives the hidden states of
    the cache-free forward pass, and leaves each token's key/value in its page slot."""
    model = Transformer(TransformerConfig.tiny(V), rngs=nnx.Rngs(1))
    kv = attention_lib.ReferenceKV(4, 2)
    pages = kv.init(*model.paged_cache_spec()[:3], jnp.float32, 10)
    rows = np.array([[1, 2, 0, 0], [5, 3, 4, 0]], np.int32)  # 7 tokens: pages 1-2, then 5, 3 (4 unused)
    n = TOKENS.shape[1]
    tokens = TOKENS.reshape(-1)
    positions = jnp.tile(jnp.arange(n, dtype=jnp.int32), 2)
    page_rows = jnp.repeat(rows, n, axis=0)
    hidden, pages = jax.jit(lambda t, p, pg, r: model.paged_forward(t, p, pg, r, kv))(tokens, positions, pages,
                                                                                       page_rows)
    positions_full, mask = sequence_inputs(jnp.ones_like(TOKENS), 0)
    want = model(TOKENS, positions_full, mask)[0].reshape(2 * n, -1)
    np.testing.assert_allclose(hidden, want, atol=1e-5)
    assert not np.asarray(pages[0][:, 4]).any() and np.asarray(pages[0][:, 3, :3]).any()
