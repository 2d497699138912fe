"""Qwen3.5 for training: gradients reach every linear-attention parameter through the chunked
form, LoRA and QLoRA target the linear-attention projections, and an export reloads (here and
as transformers' Qwen3_5ForCausalLM reads it) to the same logits."""

import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from safetensors import safe_open

from rl_core.policy.logprobs import completion_logprobs
from rl_models import HybridTransformer, lora
from rl_models.hf import export_hf, load_hf_model
from tolerances import close

HF = Path(__file__).resolve().parents[1] / "fixtures" / "hf"
TOKENS = np.array([[5, 17, 42, 99, 130, 255, 256, 270, 5, 8], [8, 13, 21, 34, 55, 89, 144, 1, 2, 3]], np.int32)
TARGETS = ("q_proj", "o_proj", "in_proj_qkv", "in_proj_z", "out_proj", "gate_proj")


def logits(model, tokens=TOKENS):
    b, n = tokens.shape
    positions = jnp.broadcast_to(jnp.arange(n), (b, n))
    hidden, _ = model(jnp.asarray(tokens), positions, jnp.broadcast_to(jnp.tril(jnp.ones((n, n), bool)), (b, n, n)))
    return np.asarray(model.logits(hidden))


@pytest.mark.e2e  # (a GRPO step on the model is tests/trainer/test_trainer_qwen35.py, e2e too)
def test_gradients_reach_every_linear_attention_parameter():
    model = load_hf_model(HF / "qwen35_text")
    graphdef, params = nnx.split(model)
    prompt, completion = jnp.asarray(TOKENS[:, :4]), jnp.asarray(TOKENS[:, 4:])

    def loss(params):
        logp, _ = completion_logprobs(nnx.merge(graphdef, params), prompt, jnp.ones(prompt.shape), completion)
        return logp.sum()

    grads = nnx.to_flat_state(jax.grad(loss)(params))
    norms = {"/".join(map(str, p)): float(jnp.abs(g[...]).max()) for p, g in grads}
    for name in ("conv_weight", "A_log", "dt_bias", "norm_weight", "in_proj_qkv/kernel", "in_proj_a/kernel",
                 "in_proj_b/kernel", "in_proj_z/kernel", "out_proj/kernel"):
        value = norms[f"linear_layers/linear_attn/{name}"]
        assert np.isfinite(value) and value > 0, (name, value)
    assert norms["layers/attn/q_proj/kernel"] > 0  # the gated attention's query and gate


def test_lora_on_linear_attention_projections_merges_to_the_adapted_logits():
    model = load_hf_model(HF / "qwen35")
    base = logits(model)
    lora.add_adapters(model, rank=4, alpha=8.0, targets=TARGETS)
    assert "linear_layers/linear_attn/in_proj_qkv" in lora.targeted(model, ("in_proj_qkv",))
    # B = 0: nothing changes, bit for bit on the CPU (XLA:TPU sums the zero branch in another order: 5e-7)
    np.testing.assert_allclose(logits(model), base, **close(rtol=0, atol=1e-9))
    for lin in lora.linears(model).values():
        if lin.lora_b is not None:
            lin.lora_b = nnx.LoRAParam(jnp.full(lin.lora_b.shape, 0.05, jnp.float32))
    adapted = logits(model)
    assert np.abs(adapted - base).max() > 0.05
    merged = lora.merge_adapters(model)
    assert isinstance(merged, HybridTransformer) and not lora.has_adapters(merged)
    np.testing.assert_allclose(logits(merged), adapted, **close(atol=1e-4))


def test_qlora_quantizes_the_linear_attention_projections_too():
    model = load_hf_model(HF / "qwen35")
    base = logits(model)
    lora.quantize_base(model, "int8")
    assert model.linear_layers.linear_attn.in_proj_qkv.kernel_scale is not None
    assert model.layers.attn.q_proj.kernel_scale is not None
    got = logits(model)
    # int8 per-channel codes: close to the float model, not equal to it. The mean error is the
    # measure (0.6% of the logits' range on the CPU); the largest one is a tail that the float
    # arithmetic moves (4.2% on the CPU, 5.3% on a v5e)
    error, span = np.abs(got - base), base.max() - base.min()
    assert 0 < error.mean() < 0.01 * span and error.max() < 0.1 * span


def test_export_of_the_multimodal_folder_is_its_text_model_and_reloads_to_the_same_logits(tmp_path):
    model = load_hf_model(HF / "qwen35")
    out = export_hf(model, tmp_path / "out", source_dir=HF / "qwen35")
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "qwen3_5_text" and config["architectures"] == ["Qwen3_5ForCausalLM"]
    with safe_open(out / "model.safetensors", framework="np") as f:
        keys = set(f.keys())
        a_log = f.get_tensor("model.layers.0.linear_attn.A_log")
        norm = f.get_tensor("model.layers.3.self_attn.q_norm.weight")
    assert not any(k.startswith(("model.visual", "model.language_model")) for k in keys)
    with safe_open(HF / "qwen35" / "model.safetensors", framework="np") as f:
        np.testing.assert_array_equal(a_log, f.get_tensor("model.language_model.layers.0.linear_attn.A_log"))
        # written back as transformers' (1 + w) norms hold it: w, not 1 + w
        np.testing.assert_allclose(norm, f.get_tensor("model.language_model.layers.3.self_attn.q_norm.weight"),
                                   **close(atol=1e-6))
    np.testing.assert_allclose(logits(load_hf_model(out)), logits(model), **close(atol=1e-6))


def test_export_without_a_source_folder_writes_a_qwen3_5_text_config_that_describes_the_model(tmp_path):
    model = load_hf_model(HF / "qwen35_text")
    out = export_hf(model, tmp_path / "out")
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "qwen3_5_text" and config["layer_types"][3] == "full_attention"
    assert config["rope_parameters"]["partial_rotary_factor"] == 0.25
    reloaded = load_hf_model(out)
    assert reloaded.config == model.config
    np.testing.assert_array_equal(logits(reloaded), logits(model))
