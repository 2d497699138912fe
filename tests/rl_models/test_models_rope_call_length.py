"""Dynamic NTK rope and LongRoPE: frequencies from the call's longest position, against the
formulas by hand (transformers' `_compute_dynamic_ntk_parameters` and `_compute_longrope_parameters`).
Parity with transformers is the llama_dynamic and phi3 fixtures' (test_models_hf_parity.py)."""

import json
import math

import jax.numpy as jnp
import numpy as np
import pytest
from rl_models.config import TransformerConfig
from rl_models.hf import load_hf_config, load_hf_model
from rl_models.rope import rope_tables
from rl_models.rope_types import DynamicNTKRope, LongRope
from tolerances import close

SHORT, LONG = (1.0, 1.5, 2.0, 3.0), (2.0, 4.0, 8.0, 16.0)


def by_hand(theta, dim, factors=(1.0,) * 8):
    return np.array([1 / (f * theta ** (2 * i / dim)) for i, f in enumerate(factors)])


def test_dynamic_ntk_is_the_default_rope_within_its_limit_and_stretches_theta_past_it():
    rope = DynamicNTKRope(factor=4.0, max_position_embeddings=64)
    for seq_len in (1, 64):
        inv, factor = rope.call_inv_freq(16, 10000.0, jnp.int32(seq_len))
        np.testing.assert_allclose(np.asarray(inv), by_hand(10000.0, 16), **close(rtol=1e-6))
        assert factor == 1.0
    base = 10000.0 * (4.0 * 100 / 64 - 3.0) ** (16 / 14)  # 100 positions: theta * (f L / M - f + 1)^(d/(d-2))
    inv, _ = rope.call_inv_freq(16, 10000.0, jnp.int32(100))
    np.testing.assert_allclose(np.asarray(inv), by_hand(base, 16), **close(rtol=2e-6))


def test_longrope_divides_by_the_short_factors_within_the_original_context_and_the_long_ones_past_it():
    rope = LongRope(short_factor=SHORT, long_factor=LONG, original_max_position_embeddings=8,
                    max_position_embeddings=40)
    scale = math.sqrt(1 + math.log(40 / 8) / math.log(8))  # the default attention factor of factor 5
    for seq_len, factors in ((8, SHORT), (9, LONG), (30, LONG)):
        inv, factor = rope.call_inv_freq(8, 10000.0, jnp.int32(seq_len))
        np.testing.assert_allclose(np.asarray(inv), by_hand(10000.0, 8, factors), **close(rtol=1e-6))
        assert factor == pytest.approx(scale)
    assert LongRope(short_factor=SHORT, long_factor=LONG, original_max_position_embeddings=8,
                    max_position_embeddings=8).attention_scale() == 1.0
    assert LongRope(short_factor=SHORT, long_factor=LONG, original_max_position_embeddings=8,
                    max_position_embeddings=40, attention_factor=1.25).attention_scale() == 1.25


def test_a_batch_takes_the_long_factors_for_every_position_once_one_row_passes_the_limit():
    """As transformers' `dynamic_rope_update`: one choice per call, from its longest position."""
    rope = LongRope(short_factor=SHORT, long_factor=LONG, original_max_position_embeddings=8,
                    max_position_embeddings=40)
    config = TransformerConfig.tiny(40, head_dim=16, partial_rotary_factor=0.5, rope_scaling=rope)
    short = jnp.arange(8)[None]
    both = jnp.stack([jnp.arange(9), jnp.zeros(9, jnp.int32)])
    cos_short = rope_tables(config, short)["global"][0]
    cos_long = rope_tables(config, both)["global"][0]
    assert cos_short.shape[-1] == 8  # the rotary dims only (half of head_dim 16)
    scale = rope.attention_scale()
    np.testing.assert_allclose(np.asarray(cos_short[0, 5, 0, :4]), scale * np.cos(5 * by_hand(1e4, 8, SHORT)),
                               **close(rtol=1e-5))
    np.testing.assert_allclose(np.asarray(cos_long[0, 5, 0, :4]), scale * np.cos(5 * by_hand(1e4, 8, LONG)),
                               **close(rtol=1e-5))


def test_longrope_factor_lists_must_cover_half_the_rotary_dims():
    rope = LongRope(short_factor=SHORT, long_factor=LONG, original_max_position_embeddings=8,
                    max_position_embeddings=40)
    with pytest.raises(ValueError, match=r"rope_scaling='LongRope': needs 6 factors per list \(half the 12 rotary dims\), has 4"):
        TransformerConfig.tiny(40, head_dim=16, partial_rotary_factor=0.75, rope_scaling=rope)
    with pytest.raises(ValueError, match=r"LongRope.long_factor has 3 entries: must have as many as short_factor \(4\)"):
        LongRope(short_factor=SHORT, long_factor=LONG[:3], original_max_position_embeddings=8, max_position_embeddings=40)


def test_the_phi3_folder_reads_its_longrope_partial_rotary_and_fused_projections(hf_fixtures):
    config = load_hf_config(hf_fixtures / "phi3")
    assert config.partial_rotary_factor == 0.75 and config.rotary_dim == 12 and config.sliding_window is None
    assert config.rope_scaling == LongRope(short_factor=(1.0, 1.02, 1.1, 1.3, 1.6, 2.0),
                                           long_factor=(1.0, 1.4, 2.5, 4.0, 7.0, 12.0),
                                           original_max_position_embeddings=8, max_position_embeddings=40)
    assert config.position_problem(8) is None and "original_max_position_embeddings (8)" in config.position_problem(9)
    assert config.tie_embeddings


def test_phi3_exports_fused_qkv_and_gate_up_and_loads_back_exactly(hf_fixtures, tmp_path):
    from rl_models.hf import export_hf
    from safetensors.numpy import load_file

    model = load_hf_model(hf_fixtures / "phi3")
    out = export_hf(model, tmp_path / "phi3")
    written = json.loads((out / "config.json").read_text())
    assert written["model_type"] == "phi3" and written["partial_rotary_factor"] == 0.75
    assert written["rope_scaling"]["rope_type"] == "longrope" and written["original_max_position_embeddings"] == 8
    tensors = load_file(str(out / "model.safetensors"))
    source = load_file(str(hf_fixtures / "phi3" / "model.safetensors"))
    assert sorted(tensors) == sorted(source)
    for key in ("model.layers.1.self_attn.qkv_proj.weight", "model.layers.1.mlp.gate_up_proj.weight"):
        np.testing.assert_array_equal(tensors[key], source[key])
    assert load_hf_config(out) == model.config
