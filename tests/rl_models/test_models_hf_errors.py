"""Broken Hugging Face folders fail with the file and the key."""

import json

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from rl_models.hf import HFFolderError, load_hf_model, load_hf_tokenizer


def _edit_tensors(path, edit):
    tensors = load_file(str(path))
    edit(tensors)
    save_file(tensors, str(path), metadata={"format": "pt"})


def _edit_config(folder, **changes):
    config = json.loads((folder / "config.json").read_text())
    config.update(changes)
    (folder / "config.json").write_text(json.dumps(config))


def test_missing_config_file(hf_copy):
    folder = hf_copy("qwen2")
    (folder / "config.json").unlink()
    with pytest.raises(FileNotFoundError, match=r"qwen2/config\.json: no such file"):
        load_hf_model(folder)


def test_missing_weights_file(hf_copy):
    folder = hf_copy("qwen2")
    (folder / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match=r"no model\.safetensors or model\.safetensors\.index\.json"):
        load_hf_model(folder)


def test_missing_shard(hf_copy):
    folder = hf_copy("qwen3")
    (folder / "model-00002-of-00003.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match=r"names shard 'model-00002-of-00003\.safetensors', which is missing"):
        load_hf_model(folder)


def test_unknown_key(hf_copy):
    folder = hf_copy("qwen2")
    _edit_tensors(folder / "model.safetensors",
                  lambda t: t.update({"model.layers.0.mlp.extra.weight": np.zeros(3, np.float32)}))
    with pytest.raises(ValueError, match=r"unknown key\(s\) .*'model\.layers\.0\.mlp\.extra\.weight' in .*model\.safetensors"):
        load_hf_model(folder)


def test_missing_key(hf_copy):
    folder = hf_copy("llama3")
    _edit_tensors(folder / "model.safetensors", lambda t: t.pop("lm_head.weight"))
    with pytest.raises(ValueError, match=r"model\.safetensors: missing key\(s\) \['lm_head\.weight'\]"):
        load_hf_model(folder)


def test_shape_mismatch(hf_copy):
    folder = hf_copy("qwen2")
    key = "model.layers.1.self_attn.k_proj.weight"
    _edit_tensors(folder / "model.safetensors", lambda t: t.update({key: t[key][:16]}))
    with pytest.raises(ValueError, match=rf"model\.safetensors: key '{key}' has shape \[16, 64\], but config\.json needs \[32, 64\]"):
        load_hf_model(folder)


def test_unsupported_architecture(hf_copy):
    folder = hf_copy("llama3")
    _edit_config(folder, model_type="gemma", architectures=["GemmaForCausalLM"])
    with pytest.raises(HFFolderError, match=r"config\.json: unsupported model_type='gemma': supported model_type values: \['gemma2', 'gemma3', 'gemma3_text', 'gemma4_text', 'gpt_oss', 'llama', 'ministral', 'mistral', 'olmo2', 'olmo3', 'phi3', 'qwen2', 'qwen3', 'qwen3_5', 'qwen3_5_moe', 'qwen3_5_moe_text', 'qwen3_5_text', 'qwen3_moe', 'smollm3'\]"):
        load_hf_model(folder)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (dict(rope_scaling={"rope_type": "su", "factor": 4.0}),
         r"rope_scaling\.rope_type='su': supported rope types are \['default', 'llama3', 'linear', 'yarn', 'dynamic', 'longrope', 'proportional'\]"),
        (dict(rope_scaling={"rope_type": "longrope", "factor": 4.0, "long_factor": [1.0] * 8},
              original_max_position_embeddings=16),
         r"rope_scaling of rope_type 'longrope' lacks 'short_factor'"),
        (dict(use_sliding_window=True), r"use_sliding_window=True"),
        (dict(hidden_act="gelu"), r"hidden_act='gelu'"),
        (dict(architectures=["LlamaForSequenceClassification"]), r"architectures=\['LlamaForSequenceClassification'\]"),
    ],
)
def test_unsupported_features(hf_copy, changes, message):
    folder = hf_copy("llama3")
    _edit_config(folder, **changes)
    with pytest.raises(ValueError, match=message):
        load_hf_model(folder)


@pytest.mark.parametrize(("changes", "message"), [
    (dict(enable_moe_block=True, num_experts=4, top_k_experts=2, moe_intermediate_size=32),
     r"unsupported enable_moe_block=True: Gemma 4's mixture-of-experts block \(experts beside each layer's MLP\) "
     r"is not implemented"),
    (dict(use_bidirectional_attention="vision"), r"use_bidirectional_attention='vision': only causal attention"),
    (dict(per_layer_config={"2": {"head_dim": 32}}), r"per_layer_config=.*every full-attention layer"),
])
def test_gemma4_options_not_implemented_are_refused_in_one_line(hf_copy, changes, message):
    folder = hf_copy("gemma4_text")
    _edit_config(folder, **changes)
    with pytest.raises(HFFolderError, match=message):
        load_hf_model(folder)


def test_quantized_tensor_dtype(hf_copy):
    folder = hf_copy("qwen2")
    key = "model.norm.weight"
    _edit_tensors(folder / "model.safetensors", lambda t: t.update({key: t[key].astype(np.int8)}))
    with pytest.raises(ValueError, match=rf"key '{key}' has dtype I8"):
        load_hf_model(folder)


@pytest.mark.parametrize("keep", [0, 100, 0.5], ids=["empty", "header-cut", "data-cut"])
def test_truncated_or_empty_weights_name_the_file(hf_copy, keep):
    folder = hf_copy("qwen2")
    path = folder / "model.safetensors"
    size = path.stat().st_size
    with path.open("r+b") as f:
        f.truncate(int(size * keep) if isinstance(keep, float) else keep)
    with pytest.raises(HFFolderError, match=r"qwen2/model\.safetensors: not a readable safetensors file .*truncated"):
        load_hf_model(folder)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{not json", r"config\.json: not valid JSON"),
        ("[1, 2]", r"config\.json: expected a JSON object, got list"),
        (b"{\"model_type\": \"llama\xff\"}", r"config\.json: not UTF-8 text"),
    ],
    ids=["syntax", "not-an-object", "not-utf8"],
)
def test_invalid_config_json_names_the_file(hf_copy, text, message):
    folder = hf_copy("llama3")
    path = folder / "config.json"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(HFFolderError, match=message):
        load_hf_model(folder)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (dict(hidden_size="64"), r"config\.json: TransformerConfig\.hidden_size='64': must be a positive int"),
        (dict(num_attention_heads=3), r"config\.json: TransformerConfig\.num_kv_heads=.*must divide num_heads \(3\)"),
        (dict(rope_theta="fast"), r"config\.json: could not convert string to float: 'fast'"),
        (dict(model_type=["llama"]), r"config\.json: unsupported model_type=\['llama'\]"),
        (dict(model_type="mixtral"), r"config\.json: unsupported model_type='mixtral': supported model_type values: \['gemma2', 'gemma3', 'gemma3_text', 'gemma4_text', 'gpt_oss', 'llama', 'ministral', 'mistral', 'olmo2', 'olmo3', 'phi3', 'qwen2', 'qwen3', 'qwen3_5', 'qwen3_5_moe', 'qwen3_5_moe_text', 'qwen3_5_text', 'qwen3_moe', 'smollm3'\]"),
    ],
    ids=["field-type", "heads", "rope-theta", "model-type-list", "model-type-unknown"],
)
def test_config_json_fields_of_the_wrong_type_or_value_name_the_file(hf_copy, changes, message):
    folder = hf_copy("llama3")
    _edit_config(folder, **changes)
    with pytest.raises(HFFolderError, match=message):
        load_hf_model(folder)


def test_unreadable_tokenizer_file_names_it(hf_copy):
    folder = hf_copy("qwen2")
    (folder / "tokenizer.json").write_text('{"version": "1.0", "model": 5}')
    with pytest.raises(HFFolderError, match=r"qwen2/tokenizer\.json: not a readable tokenizer file"):
        load_hf_tokenizer(folder)
