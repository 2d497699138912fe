"""Qwen3.5-MoE (the Qwen3.5 hybrid with experts and a shared expert in every layer) computes what
transformers computes, routes as it does, replays routing and exports back.

References were made by tests/fixtures/make_qwen35_moe_fixtures.py with transformers' own
Qwen3.5-MoE (PyTorch, float32); nothing here needs torch. "qwen35_moe" is the multimodal folder
Qwen3.5-MoE ships as (model_type qwen3_5_moe, bfloat16, untied), "qwen35_moe_text" the text-only
causal LM (qwen3_5_moe_text, tied, float32).
"""

import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rl_models import HybridTransformer
from rl_models.hf import export_hf, load_hf_config, load_hf_model, load_hf_tokenizer
from tolerances import close

NAMES = ("qwen35_moe", "qwen35_moe_text")
FOLDERS = Path(__file__).resolve().parents[1] / "fixtures" / "hf"


@pytest.fixture(params=["qwen35_moe", pytest.param("qwen35_moe_text", marks=pytest.mark.e2e)])
def name(request) -> str:
    """The folder as Qwen3.5-MoE ships (fast tier) and the text-only causal LM (e2e tier)."""
    return request.param


@pytest.fixture(scope="module")
def models():
    return {n: load_hf_model(FOLDERS / n) for n in NAMES}


def _mask(valid: np.ndarray) -> jax.Array:
    length = valid.shape[1]
    return jnp.tril(jnp.ones((length, length), bool))[None] & jnp.asarray(valid)[:, None, :]


def _routed(model, arrays, replay=None):
    hidden, _, routing = jax.jit(lambda m, *a, replay: m.routed(*a, replay=replay))(
        model, jnp.asarray(arrays["input_ids"]), jnp.asarray(arrays["position_ids"]),
        _mask(arrays["attention_mask"] > 0), replay=replay)
    return np.asarray(model.logits(hidden)), routing


def test_folder_loads_as_the_hybrid_with_experts_and_a_shared_expert(name, hf_fixtures, models):
    config = load_hf_config(hf_fixtures / name)
    assert config.layer_types == ("linear_attention",) * 3 + ("full_attention",)
    assert (config.num_experts, config.experts_per_token, config.moe_hidden_size) == (8, 2, 32)
    assert config.shared_expert and config.mlp_hidden_size == 48  # shared_expert_intermediate_size
    assert config.router == "softmax_topk" and config.norm_topk_prob
    assert config.tie_embeddings == (name == "qwen35_moe_text")
    model = models[name]
    assert isinstance(model, HybridTransformer)
    assert model.linear_layers.mlp.gate_proj.shape == (3, 8, 64, 32)  # [layers, E, D, F]
    assert model.layers.mlp.shared_expert.down_proj.kernel.shape == (1, 48, 64)
    assert model.layers.mlp.shared_expert_gate.kernel.shape == (1, 64, 1)


def test_left_padded_logits_and_routing_match_transformers(name, hf_reference, models):
    arrays, _ = hf_reference(name)
    valid = arrays["attention_mask"] > 0
    logits, routing = _routed(models[name], arrays)
    np.testing.assert_allclose(logits[valid], arrays["logits"][valid], **close(atol=1e-4, rtol=1e-4, of="model logits"))
    # every layer (model order: three linear-attention layers, then the attention layer) chose
    # transformers' experts, best first, at every real token
    experts = np.asarray(routing.experts)
    assert experts.shape == (4, *valid.shape, 2)
    np.testing.assert_array_equal(experts[:, valid], arrays["router_experts"][:, valid])


def test_replaying_the_models_own_routing_changes_nothing_and_other_experts_change_the_logits(hf_reference,
                                                                                             models):
    arrays, _ = hf_reference("qwen35_moe")
    model = models["qwen35_moe"]
    valid = arrays["attention_mask"] > 0
    own, routing = _routed(model, arrays)
    replayed, again = _routed(model, arrays, replay=routing.experts)
    np.testing.assert_array_equal(np.asarray(again.experts), np.asarray(routing.experts))
    np.testing.assert_allclose(replayed, own, atol=2e-5)  # two programs compiled apart: float32 rounding
    other = (routing.experts + 1) % 8  # every layer's choice moved to other experts
    moved, forced = _routed(model, arrays, replay=other)
    np.testing.assert_array_equal(np.asarray(forced.experts), np.asarray(other))
    assert np.abs(moved[valid] - own[valid]).max() > 1e-2
    with pytest.raises(ValueError, match="chosen experts"):
        _routed(model, arrays, replay=routing.experts[:3])


def test_greedy_decoding_matches_transformers(name, hf_fixtures, hf_reference, models, greedy_generate):
    arrays, meta = hf_reference(name)
    tok = load_hf_tokenizer(hf_fixtures / name)
    got = greedy_generate(models[name], arrays["prompt_ids"], arrays["prompt_mask"], 10, tok.eos_ids, tok.pad_id)
    np.testing.assert_array_equal(got, arrays["greedy_ids"])


def test_export_loads_back_exactly_and_without_the_source_writes_the_text_model(name, hf_fixtures, hf_reference,
                                                                              models, tmp_path):
    """With the source folder, its config.json is kept and the weights load back exactly; without,
    the config.json written from the model's own config (the text model, qwen3_5_moe_text)
    describes the same model: loaded back, it gives the reference logits."""
    model = models[name]
    out = export_hf(model, tmp_path / "src", source_dir=hf_fixtures / name)
    again = load_hf_model(out)
    assert again.config == model.config
    for (path, x), (_, y) in zip(jax.tree.leaves_with_path(nnx.state(model)),
                                 jax.tree.leaves_with_path(nnx.state(again)), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y), err_msg=str(path))
    arrays, _ = hf_reference(name)
    out = export_hf(model, tmp_path / "own")
    written = json.loads((out / "config.json").read_text())
    assert written["model_type"] == "qwen3_5_moe_text" and "intermediate_size" not in written
    assert written["shared_expert_intermediate_size"] == 48
    valid = arrays["attention_mask"] > 0
    logits, _ = _routed(load_hf_model(out), arrays)
    np.testing.assert_allclose(logits[valid], arrays["logits"][valid], **close(atol=1e-4, rtol=1e-4, of="model logits"))


def test_dense_qwen35_and_qwen3_moe_do_not_claim_the_moe_hybrid(models):
    from rl_models.hf.families import infer_family

    config = models["qwen35_moe"].config
    assert infer_family(config).model_type == "qwen3_5_moe_text"


def test_the_layers_scanned_by_group_give_the_unrolled_logits_routing_and_replay(hf_reference, models):
    """The accelerators' path (one scan over the groups of three linear-attention layers and one
    attention layer) on CPU: the same logits, every layer's routing in model order, and a replay."""
    arrays, _ = hf_reference("qwen35_moe")
    scanned = load_hf_model(FOLDERS / "qwen35_moe", scan_layers=True)
    valid = arrays["attention_mask"] > 0
    own, routing = _routed(models["qwen35_moe"], arrays)
    logits, scanned_routing = _routed(scanned, arrays)
    np.testing.assert_allclose(logits[valid], own[valid], atol=2e-5)
    np.testing.assert_array_equal(np.asarray(scanned_routing.experts), np.asarray(routing.experts))
    other = (routing.experts + 1) % 8
    moved, _ = _routed(models["qwen35_moe"], arrays, replay=other)
    scanned_moved, forced = _routed(scanned, arrays, replay=other)
    np.testing.assert_array_equal(np.asarray(forced.experts), np.asarray(other))
    np.testing.assert_allclose(scanned_moved[valid], moved[valid], atol=2e-5)
