"""export_hf then load_hf_model gives back the same model exactly."""

import json

import jax
import numpy as np
import pytest
from flax import nnx

from rl_models import Transformer, TransformerConfig
from rl_models.hf import export_hf, load_hf_model, load_hf_tokenizer
from rl_models.rope_types import LinearRope, YarnRope
from tolerances import close


def _assert_same_params(a, b):
    leaves_a = jax.tree.leaves_with_path(nnx.state(a))
    leaves_b = jax.tree.leaves_with_path(nnx.state(b))
    assert [p for p, _ in leaves_a] == [p for p, _ in leaves_b]
    for (path, x), (_, y) in zip(leaves_a, leaves_b):
        assert x.dtype == y.dtype, path
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y), err_msg=str(path))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_export_of_a_loaded_checkpoint_loads_back_exactly(hf_name, hf_fixtures, tmp_path, dtype):
    # `dtype` is the storage dtype here: it is what the exported file holds
    model = load_hf_model(hf_fixtures / hf_name, dtype=dtype, param_dtype=dtype)
    out = export_hf(model, tmp_path / "out", source_dir=hf_fixtures / hf_name)
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["config.json", "model.safetensors"]
        + [p.name for p in (hf_fixtures / hf_name).iterdir()
           if p.name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json",
                         "chat_template.jinja")]
    )
    again = load_hf_model(out, dtype=dtype, param_dtype=dtype)
    assert again.config == model.config
    _assert_same_params(model, again)
    assert json.loads((out / "config.json").read_text())["torch_dtype"] == dtype
    original, copied = load_hf_tokenizer(hf_fixtures / hf_name), load_hf_tokenizer(out)
    assert copied.eos_ids == original.eos_ids and copied.chat_template == original.chat_template


@pytest.mark.parametrize(
    ("overrides", "model_type"),
    [(dict(), "llama"), (dict(attention_bias=True, tie_embeddings=True), "qwen2"),
     (dict(qk_norm=True, head_dim=32), "qwen3"),
     (dict(sliding_window=8), "mistral"),
     (dict(sliding_window=8, layer_types=("sliding_attention", "full_attention")), "ministral"),
     (dict(nope_layers=(1,), tie_embeddings=True), "smollm3"),
     (dict(sliding_window=4, layer_types=("sliding_attention", "full_attention"), rope_local_theta=1e4,
           hidden_act="gelu_tanh", norm_plus_one=True, sandwich_norms=True, embed_scale=True, qk_norm=True,
           query_scale=24 ** -0.5, tie_embeddings=True, rope_scaling=LinearRope(factor=8.0)), "gemma3_text"),
     (dict(post_norms=True, qk_norm=True, qk_norm_all_heads=True), "olmo2"),
     (dict(post_norms=True, qk_norm=True, qk_norm_all_heads=True, sliding_window=4, rope_local_theta=1e4,
           layer_types=("sliding_attention", "full_attention"),
           rope_scaling=YarnRope(factor=4.0, original_max_position_embeddings=64)), "olmo3"),
     (dict(qk_norm=True, rope_scaling=YarnRope(factor=4.0, original_max_position_embeddings=64)), "qwen3")],
)
def test_export_of_a_fresh_model_infers_its_family(tmp_path, overrides, model_type):
    model = Transformer(TransformerConfig.tiny(40, **overrides), rngs=nnx.Rngs(0))
    out = export_hf(model, tmp_path / model_type)
    assert json.loads((out / "config.json").read_text())["model_type"] == model_type
    again = load_hf_model(out)
    assert again.config == model.config
    _assert_same_params(model, again)


def test_export_refuses_a_source_config_that_describes_another_model(hf_fixtures, tmp_path):
    model = load_hf_model(hf_fixtures / "qwen2")
    with pytest.raises(ValueError, match=r"does not describe this model: .*qk_norm"):
        export_hf(model, tmp_path / "out", source_dir=hf_fixtures / "qwen3")


@pytest.mark.parametrize("name", ["gpt_oss", "gpt_oss_mxfp4"])
def test_gpt_oss_exports_with_its_experts_interleaved_and_loads_back_exactly(name, hf_fixtures, tmp_path):
    """gpt-oss (also from MXFP4 experts, written as floats without the quantization_config): the
    gate and up columns interleave again in one gate_up_proj, and the folder loads back exactly."""
    from safetensors.numpy import load_file

    model = load_hf_model(hf_fixtures / name)
    out = export_hf(model, tmp_path / name, source_dir=hf_fixtures / name)
    written = json.loads((out / "config.json").read_text())
    assert written["model_type"] == "gpt_oss" and "quantization_config" not in written
    tensors = load_file(str(out / "model.safetensors"))
    gate_up = tensors["model.layers.0.mlp.experts.gate_up_proj"]  # [E, D, 2F]: gate, up, gate, up, ...
    np.testing.assert_array_equal(gate_up[..., 0::2], np.asarray(model.layers.mlp.gate_proj[...][0]))
    np.testing.assert_array_equal(gate_up[..., 1::2], np.asarray(model.layers.mlp.up_proj[...][0]))
    again = load_hf_model(out)
    assert again.config == model.config
    _assert_same_params(model, again)


@pytest.mark.parametrize("name", ["mistral", "qwen3_yarn", "smollm3", "gemma3_text", "gemma3", "gpt_oss", "olmo2", "olmo3", "phi3", "llama_dynamic",
                                  "gemma3_text_softcap", "gemma2", "gemma4_text", "gemma4_text_wide"])
def test_export_without_the_source_folder_writes_a_config_of_the_same_model(name, hf_fixtures, hf_reference,
                                                                          tmp_path):
    """The config.json written from the model's own config (no source folder to copy) describes
    the model transformers made: loaded back, it gives the reference logits (a multimodal
    folder is written as its text model)."""
    import jax.numpy as jnp

    arrays, meta = hf_reference(name)
    out = export_hf(load_hf_model(hf_fixtures / name), tmp_path / name)
    written = json.loads((out / "config.json").read_text())
    assert written["model_type"] == ("gemma3_text" if name == "gemma3" else meta["model_type"])
    model = load_hf_model(out)
    ids, positions = jnp.asarray(arrays["input_ids"]), jnp.asarray(arrays["position_ids"])
    valid = np.asarray(arrays["attention_mask"], bool)
    mask = jnp.tril(jnp.ones((12, 12), bool))[None] & jnp.asarray(valid)[:, None, :]
    hidden, _ = model(ids, positions, mask)
    np.testing.assert_allclose(np.asarray(model.logits(hidden))[valid], arrays["logits"][valid], **close(atol=1e-4, rtol=1e-4, of="model logits"))
