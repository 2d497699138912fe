"""config.json's two rope layouts give one TransformerConfig: the older `rope_theta` (+ `rope_scaling`)
at the top level, which most published folders (Qwen2.5, SmolLM2, Llama 3) have, and transformers 5's
`rope_parameters` ({"rope_theta": ..., "rope_type": ...})."""

import json
from pathlib import Path

import pytest

from rl_models.hf import transformer_config_from_hf

CONFIGS = Path(__file__).resolve().parents[1] / "fixtures" / "hf_configs"
TINY = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 64, "hidden_size": 32,
    "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "rms_norm_eps": 1e-5, "tie_word_embeddings": True,
}
LLAMA3 = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}


def newer_layout(hf: dict) -> dict:
    """`hf` as transformers 5 writes it: rope_theta and rope_scaling moved into rope_parameters."""
    moved = {k: v for k, v in hf.items() if k not in ("rope_theta", "rope_scaling")}
    scaling = dict(hf.get("rope_scaling") or {"rope_type": "default"})
    return moved | {"rope_parameters": {"rope_theta": hf["rope_theta"], **scaling}}


@pytest.mark.parametrize("hf", [
    TINY | {"rope_theta": 100000.0},
    TINY | {"rope_theta": 500000.0, "rope_scaling": {"rope_type": "llama3", **LLAMA3}},
    json.loads((CONFIGS / "qwen2.5-1.5b" / "config.json").read_text()),
], ids=["default", "llama3", "qwen2.5-1.5b"])
def test_both_rope_layouts_read_the_same(hf):
    older = transformer_config_from_hf(hf)
    newer = transformer_config_from_hf(newer_layout(hf))
    assert newer == older and older.rope_theta == hf["rope_theta"]
    assert (older.rope_scaling is None) == (hf.get("rope_scaling") is None)


def test_rope_parameters_without_its_theta_keeps_the_top_level_one():
    config = transformer_config_from_hf(TINY | {"rope_theta": 250000.0, "rope_parameters": {"rope_type": "default"}})
    assert config.rope_theta == 250000.0 and config.rope_scaling is None
