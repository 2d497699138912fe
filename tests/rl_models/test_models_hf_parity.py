"""Loaded Hugging Face checkpoints compute what transformers computes.

References were made by tests/fixtures/make_hf_fixtures.py with transformers
(PyTorch, float32, eager attention); nothing here needs torch.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rl_models import Transformer
from rl_models.hf import load_hf_config, load_hf_model, load_hf_tokenizer
from tolerances import close

PACKED_NAMES = ("mistral", "qwen3_yarn", "smollm3", "gemma3_text", "gemma3", "olmo2", "olmo3", "phi3", "llama_dynamic",
                "gemma3_text_softcap", "gemma2", "gemma4_text", "gemma4_text_wide")
"""The fixtures whose references include a packed batch (those made after llama3 / qwen2 / qwen3)."""

BF16_SHARE = {"gemma4_text": 0.25, "gemma4_text_wide": 0.25}
"""Fixtures whose bfloat16 logits stray further: Gemma 4's attention scale is 1 over normed queries
and keys (scores up to head_dim, whose bfloat16 rounding moves them by ~0.1), over 6 layers;
transformers' own bfloat16 forward of the fixture is 0.62 off its float32 logits (range 3.1)."""


def _logits(model, arrays, replay=None):
    """Logits of the reference input; `replay`: the experts each layer must use (mixtures of experts)."""
    ids = jnp.asarray(arrays["input_ids"])
    valid = jnp.asarray(arrays["attention_mask"], bool)
    positions = jnp.asarray(arrays["position_ids"])
    length = ids.shape[1]
    mask = jnp.tril(jnp.ones((length, length), bool))[None] & valid[:, None, :]
    hidden, _, _ = jax.jit(lambda m, r: m.routed(ids, positions, mask, replay=r))(model, replay)
    return np.asarray(model.logits(hidden)), np.asarray(valid)


def test_logits_match_transformers(hf_name, hf_fixtures, hf_reference):
    arrays, _ = hf_reference(hf_name)
    model = load_hf_model(hf_fixtures / hf_name)
    logits, valid = _logits(model, arrays)
    assert logits.shape == arrays["logits"].shape == (2, 12, 320)
    # Row 1 is left-padded by 3: compare real tokens only (pad queries attend to nothing).
    np.testing.assert_allclose(logits[valid], arrays["logits"][valid], **close(atol=1e-4, rtol=1e-4, of="model logits"))


@pytest.mark.parametrize("name", PACKED_NAMES)
def test_packed_rows_match_each_sequence_run_alone_in_transformers(name, hf_fixtures, hf_reference):
    """Two or three sequences back to back in a row (positions restarting, each attending only
    within itself, windows counted inside it) give each sequence's own logits."""
    arrays, _ = hf_reference(name)
    model = load_hf_model(hf_fixtures / name)
    ids, positions = jnp.asarray(arrays["packed_ids"]), jnp.asarray(arrays["packed_positions"])
    segments = jnp.asarray(arrays["packed_segments"])
    length = ids.shape[1]
    mask = jnp.tril(jnp.ones((length, length), bool))[None] & (segments[:, :, None] == segments[:, None, :])
    hidden, _ = jax.jit(lambda m: m(ids, positions, mask))(model)
    np.testing.assert_allclose(np.asarray(model.logits(hidden)), arrays["packed_logits"], **close(atol=1e-4, rtol=1e-4, of="model logits"))


def test_greedy_generation_matches_transformers_token_for_token(
    hf_name, hf_fixtures, hf_reference, greedy_generate
):
    arrays, meta = hf_reference(hf_name)
    model = load_hf_model(hf_fixtures / hf_name)
    tok = load_hf_tokenizer(hf_fixtures / hf_name)
    want = arrays["greedy_ids"]
    got = greedy_generate(model, arrays["prompt_ids"], arrays["prompt_mask"], want.shape[1],
                          tok.eos_ids, tok.pad_id)
    np.testing.assert_array_equal(got, want)


def test_greedy_generation_stops_at_eos_and_pads_like_transformers(
    hf_name, hf_fixtures, hf_reference, greedy_generate
):
    """With a single EOS id that row 0 produces early, both sides emit it, then
    pad (transformers stops once every row is done: compare up to there)."""
    arrays, meta = hf_reference(hf_name)
    model = load_hf_model(hf_fixtures / hf_name)
    want = arrays["greedy_stop_ids"]
    stop = int(arrays["stop_id"])
    got = greedy_generate(model, arrays["prompt_ids"], arrays["prompt_mask"], want.shape[1],
                          (stop,), meta["pad_id"])
    np.testing.assert_array_equal(got, want)
    row = list(want[0])
    assert stop in row[:4] and all(t == meta["pad_id"] for t in row[row.index(stop) + 1:])


def test_llama3_rope_scaling_is_exercised(hf_fixtures, hf_reference):
    """Without its llama3 rope_scaling, the llama3 fixture's logits move by far
    more than the tolerance: the parity test above really checks the scaling."""
    arrays, _ = hf_reference("llama3")
    config = load_hf_config(hf_fixtures / "llama3")
    assert config.rope_scaling is not None
    loaded = load_hf_model(hf_fixtures / "llama3")
    unscaled = Transformer(dataclasses.replace(config, rope_scaling=None), rngs=nnx.Rngs(0))
    nnx.update(unscaled, nnx.state(loaded))
    logits, valid = _logits(unscaled, arrays)
    assert np.abs(logits[valid] - arrays["logits"][valid]).max() > 1e-2


@pytest.mark.parametrize(("name", "without"), [
    ("mistral", dict(sliding_window=None, layer_types=None)),
    ("gemma3_text", dict(layer_types=("full_attention",) * 6)),
    ("gemma3_text", dict(rope_local_theta=None)),
    ("gemma3_text", dict(rope_scaling=None)),
    ("gemma3_text", dict(query_scale=None)),
    ("gemma3_text", dict(embed_scale=False)),
    ("qwen3_yarn", dict(rope_scaling=None)),
    ("smollm3", dict(nope_layers=())),
    ("olmo3", dict(layer_types=("full_attention",) * 4)),
    ("olmo3", dict(rope_local_theta=None)),
    ("phi3", dict(rope_scaling=None)),
    ("llama_dynamic", dict(rope_scaling=None)),
    ("gemma2", dict(attn_logit_softcapping=None)),
    ("gemma2", dict(final_logit_softcapping=None)),
    ("gemma3_text_softcap", dict(final_logit_softcapping=None)),
], ids=["mistral-window", "gemma3-window", "gemma3-local-theta", "gemma3-linear-rope", "gemma3-query-scale",
        "gemma3-embed-scale", "qwen3-yarn", "smollm3-nope",
        "olmo3-window", "olmo3-unscaled-windowed-rope", "phi3-longrope", "llama-dynamic-ntk",
        "gemma2-attention-cap", "gemma2-final-cap", "gemma3-final-cap"])
def test_each_family_setting_is_exercised(name, without, hf_fixtures, hf_reference):
    """Without the setting, the fixture's logits move by far more than the tolerance: the
    parity tests above really check it (the prompts are longer than the windows)."""
    arrays, _ = hf_reference(name)
    loaded = load_hf_model(hf_fixtures / name)
    changed = Transformer(dataclasses.replace(loaded.config, **without), rngs=nnx.Rngs(0))
    nnx.update(changed, nnx.state(loaded))
    logits, valid = _logits(changed, arrays)
    assert np.abs(logits[valid] - arrays["logits"][valid]).max() > 1e-2


@pytest.mark.parametrize("name", ["gemma3_text", "smollm3", "olmo3"])
def test_scanned_layers_pick_each_layers_window_and_rotary_table(name, hf_fixtures, hf_reference, greedy_generate):
    """With the layers scanned (as on accelerators: one traced body, the settings picked by the
    layer index) the logits and greedy tokens are those of transformers too."""
    arrays, meta = hf_reference(name)
    model = load_hf_model(hf_fixtures / name, scan_layers=True)
    logits, valid = _logits(model, arrays)
    np.testing.assert_allclose(logits[valid], arrays["logits"][valid], **close(atol=1e-4, rtol=1e-4, of="model logits"))
    want = arrays["greedy_ids"]
    got = greedy_generate(model, arrays["prompt_ids"], arrays["prompt_mask"], want.shape[1], meta["eos_ids"],
                          meta["pad_id"])
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("param_dtype", ["float32", "bfloat16"])
def test_bfloat16_compute_is_close_to_float32(hf_name, hf_fixtures, hf_reference, param_dtype):
    arrays, _ = hf_reference(hf_name)
    model = load_hf_model(hf_fixtures / hf_name, dtype="bfloat16", param_dtype=param_dtype)
    assert {x.dtype for x in jax.tree.leaves(nnx.state(model))} == {jnp.dtype(param_dtype)}
    # a bfloat16 router may flip a near tie (qwen3_moe's closest is 0.005 apart), which moves that
    # token's logits by far more than rounding does: experts run with the float32 choices replayed
    replay = jnp.asarray(arrays["router_experts"]) if model.config.num_experts else None
    logits, valid = _logits(model, arrays, replay)
    ref = arrays["logits"][valid]
    # bfloat16 keeps ~3 significant digits; 2 layers of it stay within 5% of the logit range.
    assert np.abs(logits[valid] - ref).max() < BF16_SHARE.get(hf_name, 0.05) * (ref.max() - ref.min())
