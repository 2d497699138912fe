"""rl_models.paged: the paged engine's adapter for the transformer (`PAGED_TRANSFORMER`): the
inference copy (adapters merged, compute dtype) and the paged forward."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rl_core.policy.logprobs import sequence_inputs
from rl_core.policy.protocols import PagedModel
from rl_core.rollout import attention as attention_lib
from rl_core.rollout.backend import Requests
from rl_core.rollout.paged import EngineSettings, PagedBackend
from rl_core.rollout.static import StaticBackend
from rl_core.rollout.sampler import GREEDY, Sampler
from rl_core.policy.tokens import left_pad
from rl_models import PAGED_TRANSFORMER, Transformer, TransformerConfig, lora
from tolerances import close

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
    copy = jax.jit(lambda s: nnx.split(PAGED_TRANSFORMER.inference_copy(nnx.merge(*nnx.split(model)[:1], s))))(
        nnx.split(model)[1])
    copy = nnx.merge(*copy)
    assert not jax.tree.leaves(nnx.state(copy, nnx.LoRAParam))  # merged, not carried
    want = logits(model, TOKENS)
    assert float(jnp.max(jnp.abs(want - logits(base, TOKENS)))) > 1e-2  # the adapters matter
    np.testing.assert_allclose(logits(copy, TOKENS), want,
        **close(atol=1e-4))  # W + s A B vs (x A) B s: a regrouped sum


def test_inference_copy_is_in_the_compute_dtype():
    copy = PAGED_TRANSFORMER.inference_copy(adapted(dtype="bfloat16"))
    dtypes = {x.dtype for x in jax.tree.leaves(nnx.state(copy))}
    assert dtypes == {jnp.dtype(jnp.bfloat16)}


def test_paged_forward_of_a_whole_sequence_equals_the_plain_forward():
    """One call with every token of two sequences (a prefill chunk) gives the hidden states of
    the cache-free forward pass, and leaves each token's key/value in its page slot."""
    model = Transformer(TransformerConfig.tiny(V), rngs=nnx.Rngs(1))
    kv = attention_lib.ReferenceKV(4, 2)
    pages = kv.init(*PAGED_TRANSFORMER.cache_spec(model)[:3], jnp.float32, 10)
    rows = np.array([[1, 2, 0, 0], [5, 3, 4, 0]], np.int32)  # 7 tokens: pages 1-2, then 5, 3 (4 unused)
    n = TOKENS.shape[1]
    tokens = TOKENS.reshape(-1)
    positions = jnp.tile(jnp.arange(n, dtype=jnp.int32), 2)
    page_rows = jnp.repeat(rows, n, axis=0)
    hidden, pages = jax.jit(lambda t, p, pg, r: PAGED_TRANSFORMER.forward(model, t, p, pg, r, kv))(
        tokens, positions, pages, page_rows)
    positions_full, mask = sequence_inputs(jnp.ones_like(TOKENS), 0)
    want = model(TOKENS, positions_full, mask)[0].reshape(2 * n, -1)
    np.testing.assert_allclose(hidden, want, **close(atol=1e-5))
    assert not np.asarray(pages[0][:, 4]).any() and np.asarray(pages[0][:, 3, :3]).any()


def test_the_adapter_is_the_engines_protocol_and_the_model_has_no_engine_methods():
    """The paged engine reaches a transformer through `PAGED_TRANSFORMER` (rl_core.policy.protocols.PagedModel),
    so rl_models.transformer needs nothing of rl_models.paged (no import circle)."""
    assert isinstance(PAGED_TRANSFORMER, PagedModel)
    for name in ("paged_cache_spec", "paged_forward", "inference_copy"):
        assert not hasattr(Transformer, name)


def test_an_adapted_quantized_model_decodes_in_the_paged_engine_as_in_the_static_sampler():
    """QLoRA through the engine: the adapter's inference copy (base dequantized, adapters merged)
    decodes the greedy tokens the static sampler draws from the adapted model itself."""
    model = adapted(quantize="int8")
    graphdef, state = nnx.split(model)
    rng = np.random.default_rng(1)
    tokens, mask = left_pad([rng.integers(3, V, n).tolist() for n in (2, 6, 4)], pad_id=0, max_tokens=8)
    requests = Requests(tokens, mask, 2)
    settings = EngineSettings(max_prompt_tokens=8, max_new_tokens=6, page_size=4, slots=2, prefill_chunk=4,
                              steps_per_sync=2)
    engine = PagedBackend(graphdef, settings, paging=PAGED_TRANSFORMER, eos_ids=(1,), pad_id=0)
    static = StaticBackend(Sampler(graphdef, max_new_tokens=6, eos_ids=(1,), pad_id=0))
    for backend in (engine, static):
        backend.update_weights(state, 0)
    got, want = (b.generate(requests, GREEDY, jax.random.key(0)) for b in (engine, static))
    np.testing.assert_array_equal(got.tokens, np.asarray(want.tokens))
    np.testing.assert_allclose(got.logp, np.asarray(want.logp), **close(atol=1e-4))
