"""Qwen3.5 (hybrid Gated DeltaNet + gated attention) computes what transformers computes.

References were made by tests/fixtures/make_qwen35_fixtures.py with transformers' own
Qwen3.5 (PyTorch, float32); nothing here needs torch. "qwen35" is the multimodal folder
Qwen3.5 ships as (model_type qwen3_5, text model under model.language_model., a vision
tower beside it, bfloat16, untied); "qwen35_text" the text-only causal LM (tied, float32).
"""

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl_models import HybridTransformer
from rl_models.gated_deltanet import causal_conv, chunked_delta_rule, recurrent_delta_rule
from rl_models.hf import load_hf_config, load_hf_model, load_hf_tokenizer
from tolerances import close

NAMES = ("qwen35", "qwen35_text")
FOLDERS = Path(__file__).resolve().parents[1] / "fixtures" / "hf"


@pytest.fixture(params=["qwen35", pytest.param("qwen35_text", marks=pytest.mark.e2e)])
def name(request) -> str:
    """The folder as Qwen3.5 ships (fast tier) and the text-only causal LM (e2e tier)."""
    return request.param


@pytest.fixture(scope="module")
def models():
    return {n: load_hf_model(FOLDERS / n) for n in NAMES}


def _forward(model, ids, positions, mask):
    hidden, _ = jax.jit(lambda m, *a: m(*a))(model, jnp.asarray(ids), jnp.asarray(positions), mask)
    return np.asarray(model.logits(hidden))


def test_folder_loads_as_a_hybrid_of_three_linear_layers_to_one_attention(name, hf_fixtures, models):
    config = load_hf_config(hf_fixtures / name)
    assert config.layer_types == ("linear_attention",) * 3 + ("full_attention",)
    assert config.rotary_dim == 8 and config.attention_output_gate and config.qk_norm  # 0.25 of head_dim 32
    assert config.tie_embeddings == (name == "qwen35_text")
    model = models[name]
    assert isinstance(model, HybridTransformer)
    assert model.linear_layers.linear_attn.in_proj_qkv.kernel.shape == (3, 64, 2 * 2 * 16 + 4 * 16)
    assert model.layers.attn.q_proj.kernel.shape == (1, 64, 4 * 2 * 32)  # a query and a gate per head


def test_left_padded_logits_match_transformers(name, hf_reference, models):
    arrays, _ = hf_reference(name)
    valid = arrays["attention_mask"] > 0
    mask = jnp.tril(jnp.ones((12, 12), bool))[None] & jnp.asarray(valid)[:, None, :]
    logits = _forward(models[name], arrays["input_ids"], arrays["position_ids"], mask)
    # row 1 has 3 left pads: their inputs are zeroed, so the row's state starts at its first real token
    np.testing.assert_allclose(logits[valid], arrays["logits"][valid], **close(atol=1e-4, rtol=1e-4, of="model logits"))


def test_packed_rows_match_each_sequence_run_alone(name, hf_reference, models):
    """Three sequences in two rows: the convolution and the recurrence restart at each segment."""
    arrays, _ = hf_reference(name)
    seg = arrays["packed_segments"]
    positions = np.zeros_like(seg)
    for r, k in zip(*np.nonzero(seg), strict=True):
        positions[r, k] = (seg[r, :k] == seg[r, k]).sum()
    s = jnp.asarray(seg)
    width = seg.shape[1]
    mask = jnp.tril(jnp.ones((width, width), bool)) & (s[:, :, None] == s[:, None, :]) & (s[:, None, :] > 0)
    logits = _forward(models[name], arrays["packed_ids"], positions, mask)
    real = seg > 0
    np.testing.assert_allclose(logits[real], arrays["packed_logits"][real],
                               **close(atol=1e-4, rtol=1e-4, of="model logits"))


def test_a_sequence_over_several_chunks_matches_transformers(name, hf_reference, models):
    """150 tokens: three of transformers' 64-token chunks (and ours), the state crossing two."""
    arrays, _ = hf_reference(name)
    ids = arrays["long_ids"]
    length = ids.shape[1]
    logits = _forward(models[name], ids, np.arange(length)[None], jnp.tril(jnp.ones((length, length), bool))[None])
    np.testing.assert_allclose(logits[:, ::5], arrays["long_logits"], **close(atol=1e-4, rtol=1e-4, of="model logits"))


def test_greedy_decoding_from_the_recurrent_state_matches_transformers(name, hf_fixtures, hf_reference, models,
                                                                         greedy_generate):
    """Prefill (chunked) then one token at a time (the recurrence from the cached state)."""
    arrays, meta = hf_reference(name)
    tok = load_hf_tokenizer(hf_fixtures / name)
    got = greedy_generate(models[name], arrays["prompt_ids"], arrays["prompt_mask"], 10, tok.eos_ids, tok.pad_id)
    np.testing.assert_array_equal(got, arrays["greedy_ids"])
    want = arrays["greedy_stop_ids"]
    got = greedy_generate(models[name], arrays["prompt_ids"], arrays["prompt_mask"], want.shape[1],
                          (int(arrays["stop_id"]),), meta["pad_id"])
    np.testing.assert_array_equal(got, want)


def test_tokenizer_and_chat_template_as_transformers(name, hf_fixtures, hf_reference):
    _, meta = hf_reference(name)
    tok = load_hf_tokenizer(hf_fixtures / name)
    assert tok.apply_chat_template(meta["messages"], **meta["template_kwargs"]) == meta["chat"]["with_generation_prompt"]
    assert tok.apply_chat_template(meta["messages"][1:3], add_generation_prompt=False) == \
        meta["chat"]["without_generation_prompt"]
    assert [tok.encode(t) for t in meta["texts"]] == meta["encoded"]
    assert sorted(tok.eos_ids) == sorted(meta["eos_ids"])


def _random_rule_inputs(length: int, seed: int = 0):
    keys = jax.random.split(jax.random.key(seed), 6)
    b, hk, hv, dk, dv = 2, 1, 2, 4, 3
    q = jax.random.normal(keys[0], (b, length, hk, dk))
    k = jax.random.normal(keys[1], (b, length, hk, dk))
    v = jax.random.normal(keys[2], (b, length, hv, dv))
    g = -jax.nn.softplus(jax.random.normal(keys[3], (b, length, hv)))
    beta = jax.nn.sigmoid(jax.random.normal(keys[4], (b, length, hv)))
    state = jax.random.normal(keys[5], (b, hv, dk, dv))
    return q, k, v, g, beta, state


@pytest.mark.parametrize("jit", [False, True])
def test_chunked_rule_equals_the_recurrence_across_chunks_and_resets(jit):
    """Chunks of 4 over 11 tokens (the last one padded), from a non-zero state, with resets at
    token 3 of row 0 (mid-chunk) and 8 of row 1 (a chunk's first token): the same outputs and
    final state as one token at a time."""
    q, k, v, g, beta, state = _random_rule_inputs(11)
    reset = jnp.zeros((2, 11), bool).at[0, 3].set(True).at[1, 8].set(True)
    chunked = jax.jit(chunked_delta_rule, static_argnums=7) if jit else chunked_delta_rule
    out_c, state_c = chunked(q, k, v, g, beta, state, reset, 4)
    out_r, state_r = recurrent_delta_rule(q, k, v, g, beta, state, reset)
    np.testing.assert_allclose(out_c, out_r, **close(rtol=1e-5, atol=1e-5))
    np.testing.assert_allclose(state_c, state_r, **close(rtol=1e-5, atol=1e-5))
    # a reset really cuts: row 0's tokens from 3 on do not depend on the initial state
    out_z, _ = chunked(q, k, v, g, beta, jnp.zeros_like(state), reset, 4)
    np.testing.assert_allclose(out_z[0, 3:], out_c[0, 3:], **close(atol=1e-6))
    assert np.abs(out_z[0, :3] - out_c[0, :3]).max() > 1e-2


def test_causal_conv_taps_and_reset():
    """Weight taps [1, 10, 100] (oldest first) over inputs 1..5 with a reset at token 3 and a
    conv state [7, 8]: token 0 reads 100*1 + 10*8 + 1*7, token 3 only itself."""
    x = jnp.arange(1.0, 6.0)[None, :, None]  # [1, 5, 1]
    weight = jnp.array([[1.0], [10.0], [100.0]])
    state = jnp.array([[[7.0], [8.0]]])
    reset = jnp.zeros((1, 5), bool).at[0, 3].set(True)
    out, new_state = causal_conv(x, weight, state, reset)
    pre = np.array([100 + 80 + 7, 200 + 10 + 8, 300 + 20 + 1, 400, 500 + 40])
    np.testing.assert_allclose(out[0, :, 0], pre / (1 + np.exp(-pre)), **close(rtol=1e-6))
    np.testing.assert_allclose(new_state[0, :, 0], [4.0, 5.0], **close())  # the last sequence's inputs
    _, cut = causal_conv(x[:, :4], weight, state, reset[:, :4])
    np.testing.assert_allclose(cut[0, :, 0], [0.0, 4.0], **close())  # nothing from before the reset


def test_bfloat16_compute_is_close_to_float32(name, hf_fixtures, hf_reference):
    """bfloat16 activations, matmuls, conv state and KV (the recurrent state and every norm, gate and
    decay stay float32) and bfloat16 storage: measured 4.7% (qwen35) and 5.2% (qwen35_text) of the
    logit range at most, against the dense families' 5% over 2 layers: 4 layers here, and the gated
    RMSNorm magnifies a small head output's rounding (the float32 fixtures' conditioning note)."""
    arrays, _ = hf_reference(name)
    model = load_hf_model(hf_fixtures / name, dtype="bfloat16", param_dtype="bfloat16")
    valid = arrays["attention_mask"] > 0
    mask = jnp.tril(jnp.ones((12, 12), bool))[None] & jnp.asarray(valid)[:, None, :]
    logits = _forward(model, arrays["input_ids"], arrays["position_ids"], mask)
    ref = arrays["logits"][valid]
    assert np.abs(logits[valid] - ref).max() < 0.08 * (ref.max() - ref.min())


def test_the_scanned_groups_compute_what_the_unrolled_blocks_do(hf_fixtures, hf_reference, greedy_generate):
    """scan_layers=True (the accelerators' default): one `lax.scan` over the group of 3 linear-attention
    blocks and 1 attention block; the same logits as transformers, and greedy decoding through the
    cache (its linear-attention state regrouped per scan step) gives transformers' tokens."""
    arrays, _ = hf_reference("qwen35")
    model = load_hf_model(hf_fixtures / "qwen35", scan_layers=True)
    valid = arrays["attention_mask"] > 0
    mask = jnp.tril(jnp.ones((12, 12), bool))[None] & jnp.asarray(valid)[:, None, :]
    logits = _forward(model, arrays["input_ids"], arrays["position_ids"], mask)
    np.testing.assert_allclose(logits[valid], arrays["logits"][valid], **close(atol=1e-4, rtol=1e-4, of="model logits"))
    tok = load_hf_tokenizer(hf_fixtures / "qwen35")
    got = greedy_generate(model, arrays["prompt_ids"], arrays["prompt_mask"], 10, tok.eos_ids, tok.pad_id)
    np.testing.assert_array_equal(got, arrays["greedy_ids"])
