"""rl_core.policy.logprobs: chunked unembedding equals the plain computation (values and gradients)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rl_core.policy.logprobs import completion_logprobs, sequence_inputs, token_logprobs
from rl_core.types import SharedPrompts
from rl_models import CharTokenizer, Transformer, TransformerConfig
from tolerances import close

V = CharTokenizer().vocab_size
T = 10  # not a multiple of the chunk size 3: the last chunk is padded


@pytest.fixture(scope="module")
def model():
    return Transformer(TransformerConfig.tiny(V), rngs=nnx.Rngs(1))


@pytest.fixture(scope="module")
def batch():
    """Left-padded prompts of 5, 2 and 8 tokens (P = 8) and random completions [3, T]."""
    rng = np.random.default_rng(1)
    prompt_mask = np.zeros((3, 8), np.float32)
    for row, n in enumerate((5, 2, 8)):
        prompt_mask[row, 8 - n :] = 1
    prompt_tokens = np.where(prompt_mask > 0, rng.integers(3, V, (3, 8)), 0).astype(np.int32)
    completion = rng.integers(3, V, (3, T)).astype(np.int32)
    return jnp.asarray(prompt_tokens), jnp.asarray(prompt_mask), jnp.asarray(completion)


@functools.partial(jax.jit, static_argnames=("graphdef", "chunk_tokens", "temperature"))
def chunked(state, prompt_tokens, prompt_mask, completion, *, graphdef, chunk_tokens, temperature):
    model = nnx.merge(graphdef, state)
    return completion_logprobs(
        model, prompt_tokens, prompt_mask, completion, temperature=temperature, chunk_tokens=chunk_tokens
    )


@functools.partial(jax.jit, static_argnames=("graphdef", "temperature"))
def direct(state, prompt_tokens, prompt_mask, completion, *, graphdef, temperature):
    """The plain way: full [B, P+T, V] logits, log-softmax, gather."""
    model = nnx.merge(graphdef, state)
    p = prompt_tokens.shape[1]
    positions, mask = sequence_inputs(prompt_mask, completion.shape[1])
    hidden, _ = model(jnp.concatenate([prompt_tokens, completion], axis=1), positions, mask)
    logits = model.logits(hidden)[:, p - 1 : -1] / temperature
    logp_all = jax.nn.log_softmax(logits, axis=-1)
    logp = jnp.take_along_axis(logp_all, completion[..., None], axis=-1)[..., 0]
    entropy = -jnp.sum(jax.nn.softmax(logits, axis=-1) * logp_all, axis=-1)
    return logp, entropy


def test_chunked_equals_unchunked_and_direct(model, batch):
    graphdef, state = nnx.split(model)
    kw = dict(graphdef=graphdef, temperature=0.7)  # temperature 1.0 is checked against the sampler
    logp_3, ent_3 = chunked(state, *batch, chunk_tokens=3, **kw)
    logp_all, ent_all = chunked(state, *batch, chunk_tokens=64, **kw)  # one chunk (>= T)
    logp_ref, ent_ref = direct(state, *batch, **kw)
    assert logp_3.shape == ent_3.shape == (3, T)
    # different programs (chunk widths, the plain log-softmax): float32 resolution at |logp| ~ 7
    np.testing.assert_allclose(logp_3, logp_all, **close(rtol=1e-6, atol=1e-6))
    np.testing.assert_allclose(ent_3, ent_all, **close(rtol=1e-6, atol=1e-6))
    np.testing.assert_allclose(logp_all, logp_ref, **close(rtol=1e-5, atol=1e-5))
    np.testing.assert_allclose(ent_all, ent_ref, **close(rtol=1e-5, atol=1e-5))
    assert np.all(np.asarray(logp_3) < 0)
    assert np.all((np.asarray(ent_3) > 0) & (np.asarray(ent_3) <= np.log(V) + 1e-5))


def test_chunked_gradients_equal_unchunked(model, batch):
    graphdef, state = nnx.split(model)
    weights = jnp.linspace(-1.0, 1.0, 3 * T).reshape(3, T)

    @functools.partial(jax.jit, static_argnames="chunk_tokens")
    def grad(state, chunk_tokens):
        def loss(s):
            logp, entropy = completion_logprobs(
                nnx.merge(graphdef, s), *batch, temperature=1.0, chunk_tokens=chunk_tokens
            )
            return jnp.sum(weights * logp) + 0.1 * jnp.sum(entropy)

        return jax.grad(loss)(state)

    g3, g_all = grad(state, 3), grad(state, T)
    for a, b in zip(jax.tree.leaves(g3), jax.tree.leaves(g_all), strict=True):
        np.testing.assert_allclose(a, b, **close(rtol=1e-5, atol=1e-5))
    assert max(float(jnp.max(jnp.abs(x))) for x in jax.tree.leaves(g3)) > 1e-3


def test_what_lies_under_the_prompt_padding_does_not_matter(model, batch):
    """Garbage tokens in the padded slots (mask 0) leave every log-prob unchanged."""
    graphdef, state = nnx.split(model)
    prompt_tokens, prompt_mask, completion = batch
    garbage = jnp.where(prompt_mask > 0, prompt_tokens, jnp.arange(8, dtype=jnp.int32) + 3)
    assert not np.array_equal(garbage, prompt_tokens)
    kw = dict(graphdef=graphdef, chunk_tokens=3, temperature=0.7)
    clean, _ = chunked(state, prompt_tokens, prompt_mask, completion, **kw)
    dirty, _ = chunked(state, garbage, prompt_mask, completion, **kw)
    np.testing.assert_allclose(dirty, clean, **close(rtol=0, atol=1e-6))


def test_sequence_inputs_positions_skip_left_padding():
    positions, mask = sequence_inputs(jnp.array([[0.0, 0.0, 1.0, 1.0]]), 2)
    np.testing.assert_array_equal(positions, [[0, 0, 0, 1, 2, 3]])
    # query 3 (second prompt token) sees slots 2 and 3; pads are never attended to
    np.testing.assert_array_equal(mask[0, 3], [False, False, True, True, False, False])
    np.testing.assert_array_equal(mask[0, 5], [False, False, True, True, True, True])


def test_token_logprobs_known_values():
    # logits log([0.5, 0.25, 0.25]): logp(0) = log 0.5 = -0.693147; entropy = 1.5 log 2 = 1.039721
    logits = jnp.log(jnp.array([[0.5, 0.25, 0.25]]))
    logp, entropy = token_logprobs(logits, jnp.array([0]), 1.0)
    np.testing.assert_allclose(logp, [-0.693147], **close(atol=1e-5))
    np.testing.assert_allclose(entropy, [1.039721], **close(atol=1e-5))
    # temperature 0.5 squares and renormalizes: [0.25, 0.0625, 0.0625] / 0.375 -> p(0) = 2/3
    logp, _ = token_logprobs(logits, jnp.array([0]), 0.5)
    np.testing.assert_allclose(logp, [np.log(2 / 3)], **close(atol=1e-5))


# the unrolled layout compiles two more programs per length: it runs in the e2e tier
@pytest.mark.parametrize(("scan_layers", "remat"), [(True, "none"), pytest.param(True, "full", marks=pytest.mark.e2e),
                                                   pytest.param(False, "none", marks=pytest.mark.e2e)],
                         ids=["scan", "scan-remat", "unrolled"])
@pytest.mark.parametrize("t", [T, 1], ids=["completions", "one-token"])
def test_shared_prompts_give_the_same_logprobs_and_gradients(batch, scan_layers, remat, t):
    """Each group's prompt run once (its KV cache copied to the group's rows) scores and
    differentiates exactly like every row running its own copy (rematerialised layers too, which
    take their own slice of the cache)."""
    model = Transformer(TransformerConfig.tiny(V, scan_layers=scan_layers, remat=remat), rngs=nnx.Rngs(1))
    graphdef, state = nnx.split(model)
    g = 2
    prompt_tokens, prompt_mask, completion = batch  # three prompts of 5, 2 and 8 tokens
    rows = [jnp.repeat(x, g, axis=0) for x in (prompt_tokens, prompt_mask)]
    completion = jnp.asarray(np.random.default_rng(2).integers(3, V, (3 * g, t)), jnp.int32)
    weights = jnp.linspace(-1.0, 1.0, 3 * g * t).reshape(3 * g, t)
    shared = SharedPrompts(prompt_tokens, prompt_mask)

    @functools.partial(jax.jit, static_argnames="share")
    def scored(state, share):
        def loss(s):
            logp, entropy = completion_logprobs(nnx.merge(graphdef, s), *rows, completion, chunk_tokens=3,
                                                shared=shared if share else None)
            return jnp.sum(weights * logp) + 0.1 * jnp.sum(entropy), (logp, entropy)

        return jax.grad(loss, has_aux=True)(state)

    (g_shared, (logp_shared, ent_shared)), (g_rows, (logp_rows, ent_rows)) = scored(state, True), scored(state, False)
    assert logp_shared.shape == (3 * g, t)
    np.testing.assert_allclose(logp_shared, logp_rows, **close(rtol=1e-5, atol=1e-5))
    np.testing.assert_allclose(ent_shared, ent_rows, **close(rtol=1e-5, atol=1e-5))
    for a, b in zip(jax.tree.leaves(g_shared), jax.tree.leaves(g_rows), strict=True):
        np.testing.assert_allclose(a, b, atol=2e-5, rtol=1e-4)
    assert max(float(jnp.max(jnp.abs(x))) for x in jax.tree.leaves(g_shared)) > 1e-3


@pytest.mark.e2e  # three compiles, about 10 s on 2 cores
def test_the_shared_prompt_pass_keeps_each_layers_cache_once_under_remat():
    """Rematerialised scanned layers save their inputs for the backward pass; given the whole stacked
    cache, each layer saved all of it and the scoring pass's memory grew with layers^2 (at 2, 4 and 8
    layers its temporaries grew by 17.2 then 68.8 MB: 4x for twice the layers). Each layer now takes
    its own slice: 7.8 then 15.4 MB, linear."""

    def temporaries(layers: int) -> int:
        config = TransformerConfig.tiny(V, scan_layers=True, remat="full", num_layers=layers, num_kv_heads=4)
        graphdef, state = nnx.split(nnx.eval_shape(lambda: Transformer(config, rngs=nnx.Rngs(0))))
        g, u, p, t = 8, 2, 32, 96
        rows = (jax.ShapeDtypeStruct((u * g, p), jnp.int32), jax.ShapeDtypeStruct((u * g, p), jnp.float32),
                jax.ShapeDtypeStruct((u * g, t), jnp.int32))
        shared = SharedPrompts(jax.ShapeDtypeStruct((u, p), jnp.int32), jax.ShapeDtypeStruct((u, p), jnp.float32))

        def grad(state, rows, shared):
            return jax.grad(lambda s: jnp.sum(completion_logprobs(nnx.merge(graphdef, s), *rows, shared=shared)[0]))(state)

        return jax.jit(grad).lower(state, rows, shared).compile().memory_analysis().temp_size_in_bytes

    two, four, eight = (temporaries(n) for n in (2, 4, 8))
    assert eight - four < 2.5 * (four - two), (two, four, eight)


def test_shared_prompts_must_divide_the_rows(model, batch):
    prompt_tokens, prompt_mask, completion = batch
    with pytest.raises(ValueError, match="3 rows cannot share 2 prompts"):
        completion_logprobs(model, prompt_tokens, prompt_mask, completion,
                            shared=SharedPrompts(prompt_tokens[:2], prompt_mask[:2]))
