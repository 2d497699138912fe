"""The mixture-of-experts MLP (rl_models.moe): routing, grouped expert matmuls, replay, and the
load-balancing loss; Qwen3-MoE's routing decisions against transformers'."""

import dataclasses
import functools
import json
from pathlib import Path

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rl_models import Transformer, TransformerConfig
from rl_models.attention import traced_for
from rl_models.hf import HFFolderError, load_hf_config, load_hf_model
from rl_models.lora import add_adapters, targeted
from rl_models.moe import MoE, grouped_matmul, route, tiled_grouped_matmul
from tolerances import close

E_2_1_0_M1 = [[2.0, 1.0, 0.0, -1.0]]


def moe_config(**overrides):
    return TransformerConfig.tiny(40, **(dict(num_experts=4, experts_per_token=2, moe_hidden_size=24) | overrides))


@pytest.mark.parametrize("jit", [False, True])
def test_softmax_then_top_k_renormalised(jit):
    """probs = e^[2, 1, 0, -1] / Z; top 2 = experts 0, 1; renormalised: [e^2, e] / (e^2 + e)
    = [0.7310586, 0.2689414]; without renormalising [e^2, e] / 11.475217 = [0.6439142, 0.2368828]."""
    fn = jax.jit(route, static_argnums=(1, 2, 3)) if jit else route
    experts, weights, probs = fn(jnp.asarray(E_2_1_0_M1), 2, "softmax_topk", True)
    np.testing.assert_array_equal(experts, [[0, 1]])
    np.testing.assert_allclose(weights, [[0.7310586, 0.2689414]], **close(rtol=1e-6))
    np.testing.assert_allclose(probs.sum(), 1.0, **close(rtol=1e-6))
    _, weights, _ = fn(jnp.asarray(E_2_1_0_M1), 2, "softmax_topk", False)
    np.testing.assert_allclose(weights, [[0.6439142, 0.2368828]], **close(rtol=1e-6))


def test_top_k_then_softmax_equals_renormalised_softmax_and_replay_takes_the_given_experts():
    """gpt-oss's order (top k logits, softmax over them) gives the same weights as softmax, top k,
    renormalise; replaying experts 3, 2 weighs them [e^-1, e^0] / (e^-1 + 1) = [0.2689414, 0.7310586]."""
    experts, weights, _ = route(jnp.asarray(E_2_1_0_M1), 2, "topk_softmax", False)
    np.testing.assert_array_equal(experts, [[0, 1]])
    np.testing.assert_allclose(weights, [[0.7310586, 0.2689414]], **close(rtol=1e-6))
    for router in ("softmax_topk", "topk_softmax"):
        experts, weights, _ = route(jnp.asarray(E_2_1_0_M1), 2, router, True, replay=jnp.asarray([[3, 2]]))
        np.testing.assert_array_equal(experts, [[3, 2]])
        np.testing.assert_allclose(weights, [[0.2689414, 0.7310586]], **close(rtol=1e-6))


def test_a_replay_row_of_minus_one_keeps_the_routers_own_choice():
    """Rows: logits [2, 1, 0, -1] replayed as [3, 2] (forced) and as [-1, -1] (nothing recorded: the
    router's own experts 0, 1 with weights [e^2, e] / (e^2 + e) = [0.7310586, 0.2689414])."""
    logits = jnp.asarray(E_2_1_0_M1 * 2)
    for router in ("softmax_topk", "topk_softmax"):
        experts, weights, _ = route(logits, 2, router, True, replay=jnp.asarray([[3, 2], [-1, -1]]))
        np.testing.assert_array_equal(experts, [[3, 2], [0, 1]])
        np.testing.assert_allclose(weights, [[0.2689414, 0.7310586], [0.7310586, 0.2689414]], **close(rtol=1e-6))


def test_grouped_matmuls_equal_each_token_through_its_own_experts():
    """The sorted, grouped ragged_dot computation equals a loop that sends each token through
    each of its chosen experts and sums them by the router's weights."""
    config = moe_config()
    moe = MoE(config, rngs=nnx.Rngs(0))
    x = jax.random.normal(jax.random.key(1), (3, 5, config.hidden_size))
    y, routing = jax.jit(lambda m: m.routed(x))(moe)
    assert routing.experts.shape == (3, 5, 2) and routing.probs.shape == (3, 5, 4)
    x2, experts = np.asarray(x).reshape(-1, 64), np.asarray(routing.experts).reshape(-1, 2)
    _, weights, _ = route(moe.router(jnp.asarray(x2)), 2, "softmax_topk", True)
    g, u, d = (np.asarray(w[...]) for w in (moe.gate_proj, moe.up_proj, moe.down_proj))
    want = np.zeros_like(x2)
    for n in range(x2.shape[0]):
        for j in range(2):
            e = experts[n, j]
            h = np.asarray(jax.nn.silu(x2[n] @ g[e])) * (x2[n] @ u[e])
            want[n] += float(weights[n, j]) * (h @ d[e])
    np.testing.assert_allclose(np.asarray(y).reshape(-1, 64), want, **close(rtol=1e-5, atol=1e-5))
    # every expert is used by some token here, so the test covers more than one group
    assert len(set(experts.ravel().tolist())) == 4


def test_the_forward_runs_the_experts_as_grouped_matmuls_over_the_routed_rows():
    """The program's expert matmuls are ragged_dot over the N * k = 24 routed rows (gate, up, down
    in the layer body), and no array holds every expert's output for every token ([12, 4, 24])."""
    config = moe_config()
    model = Transformer(config, rngs=nnx.Rngs(0))
    tokens = jnp.zeros((2, 6), jnp.int32)
    positions = jnp.broadcast_to(jnp.arange(6), (2, 6))
    mask = jnp.broadcast_to(jnp.tril(jnp.ones((6, 6), bool)), (2, 6, 6))
    graphdef, state = nnx.split(model)
    with traced_for("gpu"):  # as for an accelerator (CPU runs tiled_grouped_matmul instead)
        jaxpr = jax.make_jaxpr(lambda s: nnx.merge(graphdef, s)(tokens, positions, mask)[0])(state)
    eqns = [e for e in jaxpr.jaxpr.eqns]
    inner = [e for e in eqns if e.primitive.name != "ragged_dot_general"]
    while inner:  # the layers' equations sit inside the scan's and pjit's sub-jaxprs
        subs = [sub for e in inner for sub in jax.extend.core.jaxprs_in_params(e.params)]
        inner = [e for sub in subs for e in sub.eqns]
        eqns += inner
    ragged = [e for e in eqns if e.primitive.name == "ragged_dot_general"]
    assert len(ragged) == 3  # in the layer scan's body, which runs once per layer
    assert {tuple(e.invars[0].aval.shape) for e in ragged} == {(24, 64), (24, 24)}
    assert not any(tuple(v.aval.shape) in ((12, 4, 24), (4, 12, 24)) for e in eqns for v in e.outvars)


@pytest.mark.parametrize("sizes", [[5, 0, 70, 21], [0, 0, 96, 0], [1, 1, 1, 93]])
def test_tiled_grouped_matmul_equals_ragged_dot(sizes):
    """CPU's grouped matmul (groups padded to 32-row tiles, one batched matmul over the tiles)
    gives ragged_dot's result, with empty groups, a group over two tiles and single rows; and its
    gradient is ragged_dot's."""
    rows = jax.random.normal(jax.random.key(4), (96, 16))
    w = jax.random.normal(jax.random.key(5), (4, 16, 8))
    sizes = jnp.asarray(sizes, jnp.int32)
    np.testing.assert_allclose(jax.jit(tiled_grouped_matmul)(rows, w, sizes), jax.lax.ragged_dot(rows, w, sizes),
                               **close(rtol=1e-5, atol=1e-5))
    grads = [jax.grad(lambda r, w, f=f: jnp.sum(jnp.sin(f(r, w, sizes))), argnums=(0, 1))(rows, w)
             for f in (tiled_grouped_matmul, jax.lax.ragged_dot)]
    for got, want in zip(*grads, strict=True):
        np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4)


def test_bfloat16_grouped_matmuls_run_forward_and_backward_at_the_default_precision_under_highest():
    """On a TPU ragged_dot is a Mosaic kernel, which compiles no bfloat16 product at a float32
    contract precision ("Bad lhs type" on a v5e under the suite's `highest`, qwen3_moe in bfloat16):
    the grouped matmuls of bfloat16 rows, backward ones included, run at the default whatever the
    caller's; float32 ones keep the caller's; the gradient is ragged_dot's."""
    sizes = jnp.asarray([5, 0, 3], jnp.int32)

    def grad_of(dtype, f=grouped_matmul):
        rows = jax.random.normal(jax.random.key(4), (8, 16)).astype(dtype)
        w = jax.random.normal(jax.random.key(5), (3, 16, 8)).astype(dtype)
        loss = lambda r, w: jnp.sum(jnp.sin(f(r, w, sizes).astype(jnp.float32)))  # noqa: E731
        with traced_for("tpu"), jax.default_matmul_precision("highest"):
            return jax.make_jaxpr(jax.grad(loss, argnums=(0, 1)))(rows, w), jax.grad(loss, argnums=(0, 1))(rows, w)

    def precisions(jaxpr):
        eqns, inner = [], list(jaxpr.jaxpr.eqns)
        while inner:
            eqns += inner
            inner = [e for sub in (s for e in inner for s in jax.extend.core.jaxprs_in_params(e.params))
                     for e in sub.eqns]
        return [e.params["precision"] for e in eqns if e.primitive.name == "ragged_dot_general"]

    highest = (jax.lax.Precision.HIGHEST, jax.lax.Precision.HIGHEST)
    bf16_jaxpr, bf16_grads = grad_of(jnp.bfloat16)
    bf16 = precisions(bf16_jaxpr)
    assert len(bf16) >= 3 and highest not in bf16  # the forward product, d rows and d w
    f32 = precisions(grad_of(jnp.float32)[0])
    assert len(f32) >= 3 and set(f32) == {highest}
    # ragged_dot's own gradient at the default precision (a TPU compiles no bfloat16 one at `highest`)
    default = functools.partial(jax.lax.ragged_dot, precision=jax.lax.Precision.DEFAULT)
    for got, want in zip(bf16_grads, grad_of(jnp.bfloat16, default)[1], strict=True):
        np.testing.assert_allclose(np.float32(got), np.float32(want), **close(atol=1e-7, dtype=jnp.bfloat16))


def test_replaying_the_models_own_routing_changes_nothing_and_other_experts_change_the_output():
    model = Transformer(moe_config(), rngs=nnx.Rngs(0))
    tokens = jax.random.randint(jax.random.key(2), (2, 7), 0, 40)
    positions = jnp.broadcast_to(jnp.arange(7), (2, 7))
    mask = jnp.broadcast_to(jnp.tril(jnp.ones((7, 7), bool)), (2, 7, 7))
    run = jax.jit(lambda m, replay: m.routed(tokens, positions, mask, replay=replay))
    hidden, _, routing = run(model, None)
    assert routing.experts.shape == (2, 2, 7, 2)  # [layers, B, L, k]
    same, _, again = run(model, routing.experts)
    np.testing.assert_array_equal(same, hidden)
    np.testing.assert_array_equal(again.experts, routing.experts)
    other, _, _ = run(model, (routing.experts + 1) % 4)
    assert np.abs(np.asarray(other - hidden)).max() > 1e-2
    with pytest.raises(ValueError, match=r"replay of shape \(2, 2, 7, 1\)"):
        model.routed(tokens, positions, mask, replay=routing.experts[..., :1])
    dense = Transformer(TransformerConfig.tiny(40), rngs=nnx.Rngs(0))
    assert dense.routed(tokens, positions, mask)[2] is None
    with pytest.raises(ValueError, match="no experts"):
        dense.routed(tokens, positions, mask, replay=routing.experts)


def test_routing_of_a_cached_prefill_is_that_of_its_output_positions():
    """With a per-layer cache and outputs_from = L - 1 (a sampler's prefill), each layer's routing
    is given for the last position only, equal to the full forward's there."""
    model = Transformer(moe_config(scan_layers=False), rngs=nnx.Rngs(0))
    tokens = jax.random.randint(jax.random.key(3), (2, 5), 0, 40)
    positions = jnp.broadcast_to(jnp.arange(5), (2, 5))
    full_mask = jnp.broadcast_to(jnp.tril(jnp.ones((5, 5), bool)), (2, 5, 5))
    _, _, full = jax.jit(lambda m: m.routed(tokens, positions, full_mask))(model)
    mask = jnp.zeros((2, 5, 8), bool).at[:, :, :5].set(full_mask)
    _, _, last = jax.jit(lambda m: m.routed(tokens, positions, mask, m.init_cache(2, 8), 0, outputs_from=4))(model)
    assert last.experts.shape == (2, 2, 1, 2)
    np.testing.assert_array_equal(last.experts, full.experts[:, :, 4:])


def test_gradients_reach_the_chosen_experts_and_the_router_only():
    model = Transformer(moe_config(), rngs=nnx.Rngs(0))
    tokens = jnp.asarray([[1, 2, 3]])
    positions = jnp.arange(3)[None]
    mask = jnp.tril(jnp.ones((3, 3), bool))[None]
    _, _, routing = model.routed(tokens, positions, mask)

    def loss(m):
        return jnp.sum(m.logits(m(tokens, positions, mask)[0])[..., 0])

    grads = jax.jit(nnx.grad(loss))(model)
    up = np.asarray(grads.layers.mlp.up_proj[...])  # [layers, E, D, F]
    for layer in range(2):
        used = set(np.asarray(routing.experts[layer]).ravel().tolist())
        for e in range(4):
            assert (np.abs(up[layer, e]).max() > 0) == (e in used)
    assert np.abs(np.asarray(grads.layers.mlp.router.kernel[...])).max() > 0
    assert all(np.isfinite(np.asarray(g)).all() for g in jax.tree.leaves(nnx.state(grads)))


def test_config_checks_the_expert_settings():
    with pytest.raises(ValueError, match="experts_per_token=5: must be between 1 and num_experts"):
        moe_config(experts_per_token=5)
    with pytest.raises(ValueError, match="moe_hidden_size=None: must be a positive int"):
        moe_config(moe_hidden_size=None)
    with pytest.raises(ValueError, match="num_experts=0: is 0"):
        TransformerConfig.tiny(40, experts_per_token=2)
    with pytest.raises(ValueError, match="router='top1'"):
        moe_config(router="top1")


def test_qwen3_moe_routing_decisions_match_transformers(hf_fixtures, hf_reference):
    """Every layer chooses the experts transformers chose, in the same order, for every real token."""
    arrays, _ = hf_reference("qwen3_moe")
    model = load_hf_model(hf_fixtures / "qwen3_moe")
    assert (model.config.num_experts, model.config.experts_per_token, model.config.norm_topk_prob) == (8, 2, True)
    ids = jnp.asarray(arrays["input_ids"])
    valid = np.asarray(arrays["attention_mask"], bool)
    length = ids.shape[1]
    mask = jnp.tril(jnp.ones((length, length), bool))[None] & jnp.asarray(valid)[:, None, :]
    _, _, routing = model.routed(ids, jnp.asarray(arrays["position_ids"]), mask)
    got, want = np.asarray(routing.experts), arrays["router_experts"]
    np.testing.assert_array_equal(got[:, valid], want[:, valid])
    assert float(arrays["router_margin"]) > 1e-3  # no near tie decides a choice
    assert len(set(want[:, valid].ravel().tolist())) == 8  # every expert is chosen somewhere


def test_qwen3_moe_renormalisation_is_exercised(hf_fixtures, hf_reference):
    """Without norm_topk_prob the logits move by far more than the parity tolerance."""
    arrays, _ = hf_reference("qwen3_moe")
    loaded = load_hf_model(hf_fixtures / "qwen3_moe")
    changed = Transformer(dataclasses.replace(loaded.config, norm_topk_prob=False), rngs=nnx.Rngs(0))
    nnx.update(changed, nnx.state(loaded))
    ids = jnp.asarray(arrays["input_ids"])
    valid = np.asarray(arrays["attention_mask"], bool)
    mask = jnp.tril(jnp.ones((12, 12), bool))[None] & jnp.asarray(valid)[:, None, :]
    hidden, _ = changed(ids, jnp.asarray(arrays["position_ids"]), mask)
    assert np.abs(np.asarray(changed.logits(hidden))[valid] - arrays["logits"][valid]).max() > 1e-2


@pytest.mark.parametrize(("change", "message"), [
    (dict(mlp_only_layers=[0]), r"mlp_only_layers=\[0\]: layers \[0\] would have a dense MLP"),
    (dict(decoder_sparse_step=2), r"decoder_sparse_step=2: layers \[0\] would have a dense MLP"),
    (dict(num_local_experts=0), r"num_experts=0: must be a positive int"),
])
def test_qwen3_moe_layouts_not_implemented_name_the_field(change, message, hf_copy):
    folder = hf_copy("qwen3_moe")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(config | change))
    with pytest.raises(HFFolderError, match=r"config\.json: unsupported " + message):
        load_hf_model(folder)


def _reference_logits(model, arrays):
    ids = jnp.asarray(arrays["input_ids"])
    valid = np.asarray(arrays["attention_mask"], bool)
    mask = jnp.tril(jnp.ones((12, 12), bool))[None] & jnp.asarray(valid)[:, None, :]
    hidden, _, routing = jax.jit(lambda m: m.routed(ids, jnp.asarray(arrays["position_ids"]), mask))(model)
    return np.asarray(model.logits(hidden)), np.asarray(routing.experts), valid


@pytest.mark.parametrize("folder", ["gpt_oss", "gpt_oss_mxfp4"])
def test_gpt_oss_logits_and_routing_match_transformers(folder, hf_fixtures, hf_reference):
    """Sinks, alternating windows (4 here, shorter than the prompts), YaRN, biases, the clamped
    SwiGLU and the router's bias: float32 logits within 1e-4 and every layer's experts, from the
    float folder and from the MXFP4 one (dequantised at load; the same weights)."""
    arrays, _ = hf_reference("gpt_oss")
    model = load_hf_model(hf_fixtures / folder)
    c = model.config
    assert (c.router, c.attention_sinks, c.expert_bias, c.swiglu_limit, c.sliding_window) == (
        "topk_softmax", True, True, 7.0, 4)
    assert c.windowed() == (True, False, True, False)
    logits, experts, valid = _reference_logits(model, arrays)
    np.testing.assert_allclose(logits[valid], arrays["logits"][valid], atol=1e-4, rtol=1e-4)
    np.testing.assert_array_equal(experts[:, valid], arrays["router_experts"][:, valid])


def test_gpt_oss_greedy_generation_matches_transformers(hf_fixtures, hf_reference, greedy_generate):
    arrays, meta = hf_reference("gpt_oss")
    model = load_hf_model(hf_fixtures / "gpt_oss")
    want = arrays["greedy_ids"]
    got = greedy_generate(model, arrays["prompt_ids"], arrays["prompt_mask"], want.shape[1],
                          tuple(meta["eos_ids"]), meta["pad_id"])
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("without", [dict(), dict(swiglu_limit=None), dict(sliding_window=None, layer_types=None)],
                         ids=["sinks", "clamped-swiglu", "window"])
def test_each_gpt_oss_setting_is_exercised(without, hf_fixtures, hf_reference):
    """Without the setting the logits move by far more than the parity tolerance (sinks: each at
    -1e9, so they take no probability: the softmax without them)."""
    arrays, _ = hf_reference("gpt_oss")
    loaded = load_hf_model(hf_fixtures / "gpt_oss")
    changed = Transformer(dataclasses.replace(loaded.config, **without), rngs=nnx.Rngs(0))
    nnx.update(changed, nnx.state(loaded))
    if not without:
        sinks = changed.layers.attn.sinks
        sinks[...] = jnp.full(sinks.shape, -1e9)
    logits, _, valid = _reference_logits(changed, arrays)
    assert np.abs(logits[valid] - arrays["logits"][valid]).max() > 1e-2


def test_lora_adapts_attention_only_in_a_mixture_of_experts(hf_fixtures, hf_reference):
    """The default targets give the four attention projections adapters (no expert kernel, no
    router); fresh adapters change nothing; a non-zero B changes the logits; targets naming only
    expert projections are refused."""
    arrays, _ = hf_reference("qwen3_moe")
    model = load_hf_model(hf_fixtures / "qwen3_moe")
    before, _, _ = _reference_logits(model, arrays)
    assert sorted(targeted(model, ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"))) == [
        "layers/attn/k_proj", "layers/attn/o_proj", "layers/attn/q_proj", "layers/attn/v_proj"]
    add_adapters(model, rank=4, alpha=8.0)
    fresh, _, _ = _reference_logits(model, arrays)
    np.testing.assert_array_equal(fresh, before)
    b = model.layers.attn.q_proj.lora_b
    b[...] = jnp.full(b.shape, 0.05)
    moved, _, valid = _reference_logits(model, arrays)
    assert np.abs(moved[valid] - before[valid]).max() > 1e-2
    with pytest.raises(ValueError, match="name only expert projections"):
        targeted(load_hf_model(hf_fixtures / "qwen3_moe"), ("gate_proj", "mlp/down_proj"))


def test_the_published_qwen3_30b_a3b_config_reads_as_its_published_size():
    """tests/fixtures/hf_configs/qwen3-30b-a3b (read without weights): 30.5B parameters, 3.3B
    active per token (every non-expert weight and 8 of the 128 experts of each layer)."""
    config = load_hf_config(Path(__file__).resolve().parents[1] / "fixtures" / "hf_configs" / "qwen3-30b-a3b")
    assert (config.num_experts, config.experts_per_token, config.moe_hidden_size, config.norm_topk_prob) == (
        128, 8, 768, True)
    state = nnx.state(nnx.eval_shape(lambda: Transformer(config, rngs=nnx.Rngs(0))))
    total = sum(x.size for x in jax.tree.leaves(state))
    experts = sum(x.size for path, x in nnx.to_flat_state(state) if path[-1] in ("gate_proj", "up_proj", "down_proj"))
    assert total == 30_532_122_624
    assert total - experts + experts * 8 // 128 == 3_353_032_704
