"""The NNX transformer: cache equivalence, grouped-query layout, masking, tying, dtypes."""

import re

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rl_models import Transformer, TransformerConfig
from rl_models.transformer import scans_layers
from host import about_the_cpu
from tolerances import close

V = 37


def perturbed(model: Transformer, seed: int = 1) -> Transformer:
    """Add N(0, 0.1^2) noise to every parameter so that norm scales and biases
    are not trivially 1 and 0."""
    graphdef, params = nnx.split(model)
    leaves, treedef = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    noisy = [x + 0.1 * jax.random.normal(k, x.shape, x.dtype) for x, k in zip(leaves, keys)]
    return nnx.merge(graphdef, jax.tree.unflatten(treedef, noisy))


def make(seed: int = 0, **overrides) -> Transformer:
    return perturbed(Transformer(TransformerConfig.tiny(V, **overrides), rngs=nnx.Rngs(seed)))


def stacked(cache):
    """(k, v) each [layers, B, K, S, Dh], from either cache layout (unrolled: one buffer per layer)."""
    return tuple(jnp.stack(c) if isinstance(c, tuple) else c for c in cache)


def left_padded_batch():
    """Row 0: 6 prompt tokens; row 1: 2 pads then 4 prompt tokens; then 4
    teacher-forced completion tokens each. Positions = cumsum(valid) - 1."""
    tokens = jnp.array([[5, 9, 3, 7, 1, 4, 8, 2, 6, 3],
                        [0, 0, 11, 12, 13, 14, 20, 21, 22, 23]], jnp.int32)
    valid = tokens != 0
    positions = jnp.cumsum(valid, axis=1) - 1
    causal = jnp.tril(jnp.ones((10, 10), bool))
    mask = causal[None] & valid[:, None, :]
    return tokens, positions, mask, valid


CONFIGS = [
    dict(),
    dict(attention_bias=True, qk_norm=True, tie_embeddings=True),
    dict(num_kv_heads=1, head_dim=8),  # head_dim != hidden_size // num_heads
]


@pytest.mark.parametrize("overrides", CONFIGS)
def test_incremental_decoding_with_cache_matches_full_forward(overrides):
    model = make(**overrides)
    tokens, positions, mask, valid = left_padded_batch()
    full_hidden, no_cache = model(tokens, positions, mask)
    assert no_cache is None
    chex.assert_shape(full_hidden, (2, 10, 64))

    # Prefill 6 tokens, then decode one token at a time inside a jitted
    # lax.fori_loop (traced cache_index). The cache has 3 spare slots that
    # stay masked out.
    slots = 13
    mask_slots = jnp.pad(mask, ((0, 0), (0, 0), (0, slots - 10)))
    graphdef, params = nnx.split(model)

    @jax.jit
    def run(params):
        m = nnx.merge(graphdef, params)
        cache = m.init_cache(2, slots)
        h0, cache = m(tokens[:, :6], positions[:, :6], mask_slots[:, :6], cache, 0)

        def body(t, carry):
            hidden, cache = carry
            tok = jax.lax.dynamic_slice_in_dim(tokens, t, 1, axis=1)
            pos = jax.lax.dynamic_slice_in_dim(positions, t, 1, axis=1)
            msk = jax.lax.dynamic_slice_in_dim(mask_slots, t, 1, axis=1)
            h, cache = nnx.merge(graphdef, params)(tok, pos, msk, cache, t)
            return jax.lax.dynamic_update_slice_in_dim(hidden, h, t, axis=1), cache

        hidden = jnp.zeros((2, 10, 64), h0.dtype).at[:, :6].set(h0)
        hidden, cache = jax.lax.fori_loop(6, 10, body, (hidden, cache))
        return hidden, cache

    hidden, cache = run(params)
    cfg = model.config
    assert len(cache[0]) == cfg.num_layers  # unrolled on CPU: one buffer per layer
    cache = stacked(cache)
    chex.assert_shape(cache[0], (cfg.num_layers, 2, cfg.num_kv_heads, slots, cfg.head_dim))  # head-major
    assert bool(jnp.all(jnp.isfinite(hidden)))
    sel = np.asarray(valid)  # pad query rows attend to nothing: excluded
    np.testing.assert_allclose(np.asarray(hidden)[sel], np.asarray(full_hidden)[sel], **close(rtol=1e-5, atol=1e-5))
    np.testing.assert_allclose(
        np.asarray(model.logits(hidden))[sel], np.asarray(model.logits(full_hidden))[sel],
        **close(rtol=1e-5, atol=1e-5),
    )
    # The spare slots were never written.
    assert not bool(jnp.any(cache[0][:, :, :, 10:]))


def test_left_padding_does_not_change_a_rows_outputs():
    """Row 1 (left-padded) equals the same 8 tokens run alone without padding."""
    model = make()
    tokens, positions, mask, _ = left_padded_batch()
    hidden, _ = model(tokens, positions, mask)
    alone = tokens[1:, 2:]
    alone_hidden, _ = model(alone, jnp.arange(8)[None], jnp.tril(jnp.ones((1, 8, 8), bool)))
    np.testing.assert_allclose(hidden[1, 2:], alone_hidden[0], **close(rtol=1e-5, atol=1e-5))


def test_grouped_query_attention_equals_multi_head_with_repeated_kv_heads():
    """GQA with K=2 KV heads for H=4 query heads: query head h reads KV head
    h // 2. Copying each KV head's k/v projection columns into heads 2k and
    2k+1 of a plain multi-head model (K=H=4) must give the same outputs."""
    gqa = make(attention_bias=True)
    mha = Transformer(TransformerConfig.tiny(V, num_kv_heads=4, attention_bias=True),
                      rngs=nnx.Rngs(5))
    gqa_state, mha_state = nnx.state(gqa), nnx.state(mha)
    dh = gqa.config.head_dim

    def repeat_heads(x):  # [..., K * Dh] -> [..., H * Dh], each head twice in a row
        heads = x.reshape(*x.shape[:-1], -1, dh)
        return jnp.repeat(heads, 2, axis=-2).reshape(*x.shape[:-1], -1)

    flat_gqa = dict(nnx.to_flat_state(gqa_state))
    new = {}
    for path, var in nnx.to_flat_state(mha_state):
        value = flat_gqa[path][...]
        if "k_proj" in path or "v_proj" in path:
            value = repeat_heads(value)
        new[path] = value
    nnx.update(mha, nnx.from_flat_state(
        [(p, v.replace(new[p])) for p, v in nnx.to_flat_state(mha_state)]))

    tokens, positions, mask, valid = left_padded_batch()
    h_gqa, _ = gqa(tokens, positions, mask)
    h_mha, _ = mha(tokens, positions, mask)
    np.testing.assert_allclose(h_gqa, h_mha, **close(rtol=1e-5, atol=1e-5))


@pytest.mark.parametrize("scan_layers", [False, True])  # the cache's layouts: CPU's, and an accelerator's
def test_masked_cache_slots_do_not_leak_and_fully_masked_rows_are_finite(scan_layers):
    model = make(scan_layers=scan_layers)
    tokens, positions, mask, valid = left_padded_batch()
    cache = model.init_cache(2, 10)
    hidden, _ = model(tokens, positions, mask, cache, 0)
    # Overwrite the pad slots of row 1 (slots 0 and 1) with huge garbage after
    # prefill of the first 6 tokens, then decode token 6 for both rows.
    _, cache = model(tokens[:, :6], positions[:, :6], mask[:, :6], model.init_cache(2, 10), 0)
    # in the cache's own layout (unrolled on CPU: one [B, K, S, Dh] per layer; scanned elsewhere:
    # [layers, B, K, S, Dh]): another layout would run another program, equal only to rounding
    k, v = cache
    garbage = (jax.tree.map(lambda x: x.at[..., 1, :, :2, :].set(1e4), k),
               jax.tree.map(lambda x: x.at[..., 1, :, :2, :].set(-1e4), v))
    assert jax.tree.structure(garbage) == jax.tree.structure(cache)
    h_clean, _ = model(tokens[:, 6:7], positions[:, 6:7], mask[:, 6:7], cache, 6)
    h_dirty, _ = model(tokens[:, 6:7], positions[:, 6:7], mask[:, 6:7], garbage, 6)
    np.testing.assert_array_equal(h_clean, h_dirty)
    np.testing.assert_allclose(h_clean[:, 0], hidden[:, 6], **close(rtol=1e-5, atol=1e-5))
    # Row 1's first query (a pad) may attend to nothing: still finite.
    assert not bool(jnp.any(mask[1, 0]))
    assert bool(jnp.all(jnp.isfinite(hidden)))
    assert bool(jnp.all(jnp.isfinite(model.logits(hidden))))


def _param_count(model) -> int:
    return sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))


def test_tied_and_untied_unembedding():
    tied = make(tie_embeddings=True)
    untied = make(tie_embeddings=False)
    assert tied.lm_head is None
    chex.assert_shape(untied.lm_head.kernel[...], (64, V))
    # The untied head is exactly one extra D x V matrix.
    assert _param_count(untied) - _param_count(tied) == 64 * V
    tokens, positions, mask, _ = left_padded_batch()
    for model in (tied, untied):
        hidden, _ = model(tokens, positions, mask)
        logits = model.logits(hidden)
        chex.assert_shape(logits, (2, 10, V))
        assert logits.dtype == jnp.float32
    hidden, _ = tied(tokens, positions, mask)
    np.testing.assert_allclose(tied.logits(hidden), hidden @ tied.embed[...].T, **close(rtol=1e-5, atol=1e-5))


def test_only_params_are_state_and_split_merge_round_trips():
    model = make()
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    assert jax.tree.leaves(rest) == []
    again = nnx.merge(graphdef, params)
    tokens, positions, mask, _ = left_padded_batch()
    np.testing.assert_array_equal(model(tokens, positions, mask)[0], again(tokens, positions, mask)[0])


@pytest.mark.parametrize("remat", ["full", "dots_saveable", "dots_with_no_batch_dims_saveable", "offload"])
# the unrolled layout (four more compiles) runs in the e2e tier
@pytest.mark.parametrize("scan_layers", [True, pytest.param(False, marks=pytest.mark.e2e)])
def test_each_remat_policy_gives_the_same_loss_and_gradients(remat, scan_layers):
    tokens, positions, mask, valid = left_padded_batch()

    def loss_and_grads(model):
        def loss(m):
            hidden, _ = m(tokens, positions, mask)
            return jnp.sum(jax.nn.log_softmax(m.logits(hidden))[..., 3] * valid)
        return nnx.jit(nnx.value_and_grad(loss))(model)

    plain, rematted = make(scan_layers=scan_layers), make(remat=remat, scan_layers=scan_layers)
    (l1, g1), (l2, g2) = loss_and_grads(plain), loss_and_grads(rematted)
    np.testing.assert_allclose(l1, l2, **close(rtol=1e-6))
    chex.assert_trees_all_close(g1, g2, **close(rtol=1e-5, atol=1e-5))


@about_the_cpu("XLA:CPU's memory analysis of a tiny program: XLA:TPU reports 0 temporary bytes for it under "
               "every policy (v5e, 2026-12-06)")
def test_remat_policies_keep_less_for_the_backward_pass():
    """What the policies save, read off the compiled programs: a gradient step's temporary
    bytes fall from none to dots_with_no_batch_dims_saveable to full."""
    tokens, positions, mask, valid = left_padded_batch()

    def temp_bytes(remat):
        graphdef, params = nnx.split(make(remat=remat, scan_layers=True, num_layers=4))

        def loss(p):
            m = nnx.merge(graphdef, p)
            hidden, _ = m(jnp.tile(tokens, (8, 4)), jnp.tile(positions, (8, 4)), jnp.tile(mask, (8, 4, 4)))
            return jnp.sum(m.logits(hidden)[..., 3])

        return jax.jit(jax.grad(loss)).lower(params).compile().memory_analysis().temp_size_in_bytes

    none, dots, full = temp_bytes("none"), temp_bytes("dots_with_no_batch_dims_saveable"), temp_bytes("full")
    assert none > dots > full, (none, dots, full)


def test_remat_booleans_of_earlier_versions_are_read_as_full_and_none():
    assert TransformerConfig.tiny(V, remat=True).remat == "full"
    assert TransformerConfig.tiny(V, remat=False).remat == "none"


@pytest.mark.parametrize("param_dtype", ["float32", "bfloat16"])
def test_bfloat16_compute_cache_and_float32_logits(param_dtype):
    config = TransformerConfig.tiny(V, dtype="bfloat16", param_dtype=param_dtype)
    model = Transformer(config, rngs=nnx.Rngs(0))
    # parameters are stored in param_dtype; activations and the cache use the compute dtype
    assert {x.dtype for x in jax.tree.leaves(nnx.state(model))} == {jnp.dtype(param_dtype)}
    cache = model.init_cache(2, 12)
    assert {x.dtype for x in jax.tree.leaves(cache)} == {jnp.dtype(jnp.bfloat16)}
    tokens, positions, mask, _ = left_padded_batch()
    hidden, cache = model(tokens, positions, jnp.pad(mask, ((0, 0), (0, 0), (0, 2))), cache, 0)
    assert hidden.dtype == jnp.bfloat16
    logits = model.logits(hidden)
    assert logits.dtype == jnp.float32 and bool(jnp.all(jnp.isfinite(logits)))


def test_bad_shapes_and_overflowing_cache_index_are_rejected():
    model = make()
    tokens, positions, mask, _ = left_padded_batch()
    with pytest.raises(ValueError, match="attention_mask of shape"):
        model(tokens, positions, mask[:, :, :9])
    with pytest.raises(ValueError, match="do not fit 10 cache slots"):
        model(tokens[:, :2], positions[:, :2], mask[:, :2], model.init_cache(2, 10), 9)


def test_is_an_rl_core_policy():
    from rl_core.policy.protocols import Policy

    model = make()
    assert isinstance(model, Policy)
    assert model.vocab_size == V


def test_rotary_scores_depend_only_on_relative_position():
    """<rope(q, m), rope(k, n)> is a function of m - n (here 7 - 3 == 104 - 100)."""
    from rl_models.rope import apply_rope, rope_inv_freq

    q = jax.random.normal(jax.random.key(0), (1, 1, 1, 16))
    k = jax.random.normal(jax.random.key(1), (1, 1, 1, 16))
    inv = rope_inv_freq(16, 10000.0, None)

    def score(m, n):
        return jnp.sum(apply_rope(q, jnp.array([[m]]), inv) * apply_rope(k, jnp.array([[n]]), inv))

    np.testing.assert_allclose(score(7, 3), score(104, 100), rtol=1e-4)
    assert abs(float(score(7, 3)) - float(score(3, 7))) > 1e-3  # not symmetric: positions matter


def test_rotate_is_hugging_faces_rotate_half_form():
    """x * cos + rotate_half(x) * sin with rotate_half(x) = (-x2, x1), written out as the
    textbook does, for positions 0..5 and a llama3-scaled head of 8; bfloat16 in, bfloat16 out."""
    from rl_models.config import RopeScaling
    from rl_models.rope import rope_cos_sin, rope_inv_freq, rotate

    scaling = RopeScaling(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=4)
    inv = rope_inv_freq(8, 500000.0, scaling)
    positions = jnp.arange(6)[None]
    x = jax.random.normal(jax.random.key(0), (1, 6, 3, 8))
    freqs = np.arange(6, dtype=np.float32)[:, None] * inv  # [L, 4]
    cos = np.concatenate([np.cos(freqs)] * 2, -1)[None, :, None]
    sin = np.concatenate([np.sin(freqs)] * 2, -1)[None, :, None]
    x1, x2 = np.split(np.asarray(x), 2, axis=-1)
    expected = np.asarray(x) * cos + np.concatenate([-x2, x1], -1) * sin
    np.testing.assert_allclose(rotate(x, *rope_cos_sin(positions, inv)), expected, **close(rtol=1e-6, atol=1e-6))
    out = rotate(x.astype(jnp.bfloat16), *rope_cos_sin(positions, inv))
    assert out.dtype == jnp.bfloat16 and out.shape == x.shape


def test_cpu_attention_gradient_is_autodiffs():
    """The CPU attention core's own VJP (library-friendly transposes) against autodiff of the
    plain core: causal and padding masks, a fully masked query row, float32; bfloat16 keeps dtypes."""
    from rl_models.attention import _attention_core, _attention_core_cpu

    b, k, q_len, s, dh = 3, 2, 6, 5, 8
    keys = jax.random.split(jax.random.key(0), 4)
    q, kk, v = (jax.random.normal(key, shape) for key, shape in
                zip(keys, [(b, k, q_len, dh), (b, k, s, dh), (b, k, s, dh)], strict=False))
    weights = jax.random.normal(keys[3], (b, k, q_len, dh))
    mask = jnp.broadcast_to(jnp.tril(jnp.ones((q_len, s), bool), k=-1), (b, k, q_len, s))
    mask = mask.at[1, :, :, 0].set(False)  # a padded key slot in row 1; query 0 sees nothing at all

    def loss(core, *args):
        return jnp.sum(core(*args, mask, 0.35) * weights)

    expected = jax.grad(lambda *a: loss(_attention_core, *a), argnums=(0, 1, 2))(q, kk, v)
    got = jax.grad(lambda *a: loss(_attention_core_cpu, *a), argnums=(0, 1, 2))(q, kk, v)
    np.testing.assert_allclose(_attention_core_cpu(q, kk, v, mask, 0.35), _attention_core(q, kk, v, mask, 0.35),
        **close())
    for g, e in zip(got, expected, strict=True):
        np.testing.assert_allclose(g, e, **close(rtol=1e-5, atol=1e-6))
    assert float(jnp.abs(got[1]).sum()) > 0
    half = jax.grad(lambda *a: loss(_attention_core_cpu, *a), argnums=(0, 1, 2))(
        *(x.astype(jnp.bfloat16) for x in (q, kk, v)))
    assert [g.dtype for g in half] == [jnp.bfloat16] * 3


def test_cpu_matmul_gradient_is_autodiffs():
    """Linear's CPU matmul (weight gradient through a transposed copy) against autodiff of x @ w."""
    from rl_models.layers import _matmul_cpu

    x = jax.random.normal(jax.random.key(0), (12, 5))
    w = jax.random.normal(jax.random.key(1), (5, 3))
    weights = jax.random.normal(jax.random.key(2), (12, 3))
    expected = jax.grad(lambda x, w: jnp.sum((x @ w) * weights), argnums=(0, 1))(x, w)
    got = jax.grad(lambda x, w: jnp.sum(_matmul_cpu(x, w) * weights), argnums=(0, 1))(x, w)
    np.testing.assert_allclose(_matmul_cpu(x, w), x @ w, **close())
    for g, e in zip(got, expected, strict=True):
        np.testing.assert_allclose(g, e, **close(rtol=1e-5, atol=1e-6))


LOGICAL_AXES = {"vocab", "embed", "heads", "kv_heads", "head_dim", "mlp", "norm", "layers"}


def test_every_parameter_names_its_logical_axes_and_layers_are_stacked():
    model = make(attention_bias=True, qk_norm=True, tie_embeddings=False)
    flat = nnx.to_flat_state(nnx.state(model, nnx.Param))
    for path, var in flat:
        axes = var.get_metadata("out_sharding")
        assert len(axes) == var[...].ndim and set(axes) <= LOGICAL_AXES, (path, axes)
        # every block parameter has the layer axis first, sized num_layers
        assert (path[0] == "layers") == (axes[0] == "layers"), path
        if path[0] == "layers":
            assert var[...].shape[0] == model.config.num_layers
    axes = {path: var.get_metadata("out_sharding") for path, var in flat}
    assert axes[("embed",)] == ("vocab", "embed")
    assert axes[("layers", "attn", "q_proj", "kernel")] == ("layers", "embed", "heads")
    assert axes[("layers", "attn", "k_proj", "bias")] == ("layers", "kv_heads")
    assert axes[("layers", "attn", "q_norm", "weight")] == ("layers", "head_dim")
    assert axes[("layers", "mlp", "down_proj", "kernel")] == ("layers", "mlp", "embed")
    assert axes[("lm_head", "kernel")] == ("embed", "vocab")


def test_stacked_layer_i_is_block_i_of_an_unrolled_model():
    """Running the blocks one by one from the stacked params gives the scanned result."""
    from rl_models.rope import rope_cos_sin, rope_inv_freq

    model = make()
    tokens, positions, mask, valid = left_padded_batch()
    hidden, _ = model(tokens, positions, mask)
    cfg = model.config
    graphdef, stacked = nnx.split(model.layers)
    x = jnp.take(model.embed[...], tokens, axis=0)
    rope = rope_cos_sin(positions, rope_inv_freq(cfg.head_dim, cfg.rope_theta, None))
    for i in range(cfg.num_layers):
        block = nnx.merge(graphdef, jax.tree.map(lambda a, i=i: a[i], stacked))
        x, _, _ = block(x, rope, mask, None, 0, i)
    np.testing.assert_allclose(model.final_norm(x)[valid], hidden[valid], **close(rtol=1e-5, atol=1e-5))


def _lowered_train_step_size(layers: int, scan_layers: bool) -> int:
    """Characters of the lowered training step (loss, gradients, an Adam-style update)."""
    tokens, positions, mask, valid = left_padded_batch()
    config = TransformerConfig.tiny(V, num_layers=layers, scan_layers=scan_layers)
    graphdef, params = nnx.split(Transformer(config, rngs=nnx.Rngs(0)))

    def step(params):
        def loss(p):
            m = nnx.merge(graphdef, p)
            hidden, _ = m(tokens, positions, mask)
            return jnp.sum(jax.nn.log_softmax(m.logits(hidden))[..., 3] * valid)

        grads = jax.grad(loss)(params)
        return jax.tree.map(lambda p, g: p - 1e-3 * g / (jnp.abs(g) + 1e-8), params, grads)

    return len(jax.jit(step).lower(params).as_text())


def test_program_size_does_not_grow_with_depth_when_scanned():
    """scan_layers=True: the lowered step of a 16-layer model is about the size of a 2-layer
    one's; unrolled (scan_layers=False), the body is repeated once per layer (measured: 3.1x larger
    at 16 layers than at 2; the rest of the program does not grow)."""
    small, deep = _lowered_train_step_size(2, True), _lowered_train_step_size(16, True)
    assert deep < 1.1 * small, (small, deep)
    unrolled_small, unrolled_deep = _lowered_train_step_size(2, False), _lowered_train_step_size(16, False)
    assert unrolled_deep > 2.5 * unrolled_small, (unrolled_small, unrolled_deep)


def test_scanned_and_unrolled_layers_compute_the_same_loss_gradients_and_cache():
    """The loop is how the layers run, not what they compute: same stacked parameters, same
    loss, gradients and KV cache."""
    tokens, positions, mask, valid = left_padded_batch()
    assert scans_layers(TransformerConfig.tiny(V)) == (jax.default_backend() != "cpu")  # None: unrolled on CPU only

    def run(scan_layers):
        model = make(scan_layers=scan_layers)

        def loss(m):
            hidden, _ = m(tokens, positions, mask)
            return jnp.sum(jax.nn.log_softmax(m.logits(hidden))[..., 3] * valid)

        cache = model.init_cache(tokens.shape[0], tokens.shape[1] + 2)
        _, cache = nnx.jit(lambda m, c: m(tokens, positions, jnp.pad(mask, ((0, 0), (0, 0), (0, 2))), c, 0))(
            model, cache)
        return nnx.jit(nnx.value_and_grad(loss))(model), cache

    (l1, g1), c1 = run(True)
    (l2, g2), c2 = run(False)
    np.testing.assert_allclose(l1, l2, **close(rtol=1e-6))
    chex.assert_trees_all_close(g1, g2, **close(atol=1e-5, rtol=1e-5))
    assert not isinstance(c1[0], tuple) and len(c2[0]) == 2  # scanned: stacked; unrolled: per layer
    chex.assert_trees_all_close(c1, stacked(c2), **close(atol=1e-6, rtol=1e-6))


@pytest.mark.parametrize("scan_layers", [False, True])
def test_outputs_from_returns_the_later_positions_with_the_same_gradients_and_cache(scan_layers):
    """`outputs_from=k` is the full call's hidden states [:, k:], with the same gradient of
    anything computed from them and the same KV cache, whether the last block skips the
    earlier positions' query side (unrolled) or the output is sliced (scanned)."""
    tokens, positions, mask, _ = left_padded_batch()
    model, k = make(scan_layers=scan_layers, attention_bias=True, qk_norm=True), 6

    def loss(m, outputs_from):
        hidden, _ = m(tokens, positions, mask, outputs_from=outputs_from)
        return jnp.sum(jax.nn.log_softmax(m.logits(hidden[:, hidden.shape[1] - 4 :]))[..., 3])

    (l_full, g_full), (l_part, g_part) = (nnx.jit(nnx.value_and_grad(loss), static_argnums=1)(model, of)
                                          for of in (0, k))
    np.testing.assert_allclose(l_part, l_full, **close(rtol=1e-6))
    chex.assert_trees_all_close(g_part, g_full, **close(rtol=1e-5, atol=1e-5))
    cache = model.init_cache(2, 12)
    slots = jnp.pad(mask, ((0, 0), (0, 0), (0, 2)))
    (h_full, c_full), (h_part, c_part) = (model(tokens, positions, slots, cache, 0, outputs_from=of)
                                          for of in (0, 9))
    chex.assert_shape(h_part, (2, 1, model.config.hidden_size))
    chex.assert_trees_all_close((h_part, c_part), (h_full[:, 9:], c_full), **close(rtol=1e-6, atol=1e-6))
    with pytest.raises(ValueError, match="outputs_from=10: the call has 10 positions"):
        model(tokens, positions, mask, outputs_from=10)


def test_unrolled_last_block_computes_its_query_side_only_for_the_output_positions():
    """The compiled program's matmul work: the last block's q/o/gate/up/down products run on
    2 x 4 rows instead of 2 x 10, and nothing else changes, so the saving is exactly those rows'
    share of them (XLA's cost analysis of the forward pass)."""
    tokens, positions, mask, _ = left_padded_batch()
    model = make(scan_layers=False)
    cfg = model.config

    def flops(outputs_from):
        fn = nnx.jit(lambda m: m(tokens, positions, mask, outputs_from=outputs_from)[0])
        return fn.lower(model).compile().cost_analysis()["flops"]

    d, h, f = cfg.hidden_size, cfg.num_heads * cfg.head_dim, cfg.mlp_hidden_size
    query_side = 2 * (d * h + h * d + 3 * d * f)  # q, o, gate, up, down per row
    scores = 2 * 2 * cfg.num_heads * cfg.head_dim  # q.k and p.v per (query row, key slot)
    saved_rows = 2 * 6
    saved = saved_rows * query_side + saved_rows * 10 * scores
    full, part = flops(0), flops(6)
    # measured 1.02: the rest of the difference is those rows' norm, rotary and residual work
    assert 0.98 * saved <= full - part <= 1.1 * saved, (full, part, saved)


@about_the_cpu("the unrolled layers loop_view serves are XLA:CPU's layout; accelerators scan a stack")
def test_unrolled_decoding_reads_each_layers_cache_without_slicing_it_out():
    """The compiled decode loop of an unrolled model: with init_cache's per-layer buffers no
    dynamic-slice is left (each layer reads its own buffer and updates it in place); the same
    loop over a stacked [layers, ...] cache slices each layer's K/V out at every token."""
    model = make()
    b, s = 2, 16

    def dynamic_slices(cache) -> int:
        def decode(m, cache):
            def body(t, cache):
                return m(jnp.ones((b, 1), jnp.int32), jnp.full((b, 1), t), jnp.ones((b, 1, s), bool), cache, t)[1]

            return jax.lax.fori_loop(0, s, body, cache)

        hlo = nnx.jit(decode, donate_argnums=1).lower(model, cache).compile().as_text()
        names = [line.split("=")[0] for line in hlo.splitlines() if "=" in line]
        return sum("dynamic-slice" in n and "update" not in n for n in names)

    per_layer = model.init_cache(b, s)
    assert dynamic_slices(per_layer) == 0
    assert dynamic_slices(stacked(per_layer)) > 0  # the layout the per-layer buffers replace


def test_attention_implementation_is_validated():
    with pytest.raises(ValueError, match="attention='flash'"):
        TransformerConfig.tiny(V, attention="flash")
    with pytest.raises(ValueError, match="cuDNN attention needs dtype='bfloat16'"):
        TransformerConfig.tiny(V, attention="cudnn")


@about_the_cpu("the unrolled layers loop_view serves are XLA:CPU's layout; accelerators scan a stack")
@pytest.mark.parametrize("fuse_max", [None, 0])
def test_a_decode_loop_through_loop_view_copies_no_weights_and_decodes_the_same(monkeypatch, fuse_max):
    """rl_core.policy.protocols.loop_policy (Transformer.loop_view): the compiled decode loop of an
    unrolled model, run through the view, holds no instruction that writes a weight-shaped array
    (each layer's slice out of the stacks, or q/k/v or gate/up kernels concatenated, is made once
    before the loop); run on the model itself, the loop copies them at every token. The logits
    are the same; with fuse_max 0, fused_linear's separate matmuls (large kernels) give the fused ones'."""
    from rl_core.policy.protocols import loop_policy
    from rl_models import layers

    model = make()
    if fuse_max is not None:
        monkeypatch.setattr(layers, "FUSE_MAX_KERNEL_ELEMENTS", fuse_max)
    assert not scans_layers(model.config)  # the CPU default
    cfg, b, s = model.config, 2, 8
    shapes = {(cfg.hidden_size, cfg.mlp_hidden_size), (cfg.mlp_hidden_size, cfg.hidden_size),
              (cfg.hidden_size, cfg.num_heads * cfg.head_dim), (cfg.hidden_size, 2 * cfg.mlp_hidden_size)}

    def decode(m, cache, view: bool):
        get = loop_policy(m) if view else (lambda: m)

        def body(t, carry):
            cache, logits = carry
            step = get()
            hidden, cache = step(jnp.full((b, 1), t % V, jnp.int32), jnp.full((b, 1), t), jnp.ones((b, 1, s), bool),
                                 cache, t)
            return cache, logits.at[t].set(step.logits(hidden[:, 0]))

        return jax.lax.fori_loop(0, s, body, (cache, jnp.zeros((s, b, V), jnp.float32)))[1]

    def weight_copies_in_loop(view: bool) -> int:
        hlo = nnx.jit(decode, static_argnums=2).lower(model, model.init_cache(b, s), view).compile().as_text()
        names = set(re.findall(r"body=%?([\w.\-]+)", hlo))
        bodies = [c for c in hlo.split("\n\n") if c.strip().lstrip("%").split(" ", 1)[0] in names]
        assert bodies
        found = re.findall(r"= f32\[(\d+),(\d+)\]\S* (?!get-tuple-element|parameter|bitcast)", "\n".join(bodies))
        return sum((int(a), int(c)) in shapes for a, c in found)

    assert weight_copies_in_loop(True) == 0
    assert weight_copies_in_loop(False) > 0
    viewed = nnx.jit(decode, static_argnums=2)(model, model.init_cache(b, s), True)
    plain = nnx.jit(decode, static_argnums=2)(model, model.init_cache(b, s), False)
    np.testing.assert_allclose(viewed, plain, **close(rtol=1e-5, atol=1e-5))
