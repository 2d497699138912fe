"""A model family is one record (rl_models.hf.families): loading, export and the weight map read
the record, exactly one record claims a config, and no family name appears anywhere else."""

import ast
import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from rl_models import TransformerConfig
from rl_models.config import LinearAttention
from rl_models.hf import export_hf, hf_config_from_transformer_config, load_hf_config, load_hf_model
from rl_models.hf.config import transformer_config_from_hf
from rl_models.hf.families import FAMILIES, infer_family
from rl_models.hf.family import Family, claimant, named, refusal
from rl_models.hf.peft import peft_tensors
from rl_models.lora import add_adapters
from rl_models.rope_types import LongRope, YarnRope

ROOT = Path(__file__).resolve().parents[2]
HF = ROOT / "tests" / "fixtures" / "hf"
PUBLISHED = ROOT / "tests" / "fixtures" / "hf_configs"
RECORDS = {Path("packages/rl-models/src/rl_models/hf/families.py")}
"""The modules that may name a family."""
ALLOWED = {(Path("packages/rl-models/src/rl_models/hf/from_gguf.py"), "llama")}
"""llama.cpp's own name for its architecture (GGUF's general.architecture), not a model_type."""


def _family_strings(path: Path, names: set[str]) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names]


def test_no_family_name_appears_outside_the_family_records():
    names = set(FAMILIES) | {family.architecture for family in FAMILIES.values()}
    found = []
    for top in ("packages", "apps"):
        for path in sorted((ROOT / top).rglob("*.py")):
            relative = path.relative_to(ROOT)
            if relative in RECORDS or ".venv" in relative.parts:
                continue
            found += [f"{relative}:{line}: {value!r}" for line, value in _family_strings(path, names)
                      if (relative, value) not in ALLOWED]
    assert found == []


def test_the_scan_finds_a_family_name(tmp_path):
    """The scan above sees names in plain strings and f-strings alike, and nothing else."""
    source = tmp_path / "branch.py"
    source.write_text('if model_type == "qwen2":\n    x = f"{a}qwen3"\ny = "qwen2 and more"\nz = "Qwen3ForCausalLM"\n')
    found = sorted(_family_strings(source, {"qwen2", "qwen3", "Qwen3ForCausalLM"}))
    assert found == [(1, "qwen2"), (2, "qwen3"), (4, "Qwen3ForCausalLM")]


def _folders() -> list[Path]:
    return sorted(p.parent for p in [*HF.glob("*/config.json"), *PUBLISHED.glob("*/config.json")])


@pytest.mark.parametrize("folder", _folders(), ids=lambda p: p.name)
def test_every_folder_is_claimed_by_its_own_family_alone(folder):
    """What a record reads, it claims (a multimodal folder's config: its text model's record), and
    no other record does: each fixture and published config.json."""
    model_type = json.loads((folder / "config.json").read_text())["model_type"]
    family = infer_family(load_hf_config(folder))
    assert family.model_type == (FAMILIES[model_type].written_as or model_type)


def test_a_config_no_family_computes_lists_every_records_refusal():
    config = TransformerConfig.tiny(40, post_norms=True, qk_norm=True, qk_norm_all_heads=True,
                                    attention_bias=True, attention_out_bias=True)
    with pytest.raises(ValueError, match="no Hugging Face family computes this config") as caught:
        infer_family(config)
    reasons = str(caught.value).split(": ", 1)[1].split("; ")
    assert len(reasons) == len(FAMILIES)
    # each names its family and the field that disagreed
    assert "llama has qk_norm=False, this config True" in reasons
    assert "gpt_oss has attention_sinks=True, this config False" in reasons
    assert "qwen3 has qk_norm_all_heads=False, this config True" in reasons
    assert "olmo2 has no attention biases" in reasons
    assert "olmo3 windows three layers in four (sliding_window)" in reasons
    assert "gemma3 is a multimodal folder, whose text model is written as gemma3_text" in reasons


def test_records_that_overlap_are_an_error_naming_them():
    records = named({"first": Family("FirstForCausalLM"), "second": Family("SecondForCausalLM")})
    with pytest.raises(ValueError, match=r"several families claim this config \(first, second\)"):
        claimant(TransformerConfig.tiny(40), records)


def test_an_explicit_model_type_must_claim_the_config():
    with pytest.raises(ValueError, match=r"model_type='qwen2' cannot express this config: qwen2 has attention_bias=True, this config False"):
        hf_config_from_transformer_config(TransformerConfig.tiny(40, qk_norm=True), "qwen2")


def test_a_new_family_is_one_record(monkeypatch, tmp_path):
    """A record added to FAMILIES (here Qwen3's block under another name, claiming what Qwen3 would
    with q/k/v/o biases) loads its folders, and export writes its configs, through that record alone."""
    qwen3 = FAMILIES["qwen3"]
    biased = lambda c: None if c.attention_bias else "toy has q/k/v/o biases"  # noqa: E731
    monkeypatch.setitem(FAMILIES, "toy", dataclasses.replace(qwen3, architecture="ToyForCausalLM", model_type="toy",
                                                             claims=biased))
    monkeypatch.setitem(FAMILIES, "qwen3", dataclasses.replace(qwen3, claims=lambda c: "qwen3 is toy here"
                                                               if c.attention_bias else None))
    folder = tmp_path / "toy"
    folder.mkdir()
    for name in ("model.safetensors", "config.json"):
        (folder / name).write_bytes((HF / "qwen3_bias" / name).read_bytes())
    config = json.loads((folder / "config.json").read_text()) | {"model_type": "toy", "architectures": ["ToyForCausalLM"]}
    (folder / "config.json").write_text(json.dumps(config))
    model = load_hf_model(folder)
    assert model.config == load_hf_config(HF / "qwen3_bias")
    out = export_hf(model, tmp_path / "out")
    written = json.loads((out / "config.json").read_text())
    assert (written["model_type"], written["architectures"]) == ("toy", ["ToyForCausalLM"])
    again = load_hf_model(out)
    np.testing.assert_array_equal(np.asarray(again.layers.attn.o_proj.bias[...]),
                                  np.asarray(model.layers.attn.o_proj.bias[...]))


def test_qwen35_writes_its_rope_scaling_in_rope_parameters():
    """The hybrid family's config.json comes from the same writer as the others: a scaled rope is
    written (in rope_parameters, with partial_rotary_factor) and reads back as the same config."""
    config = TransformerConfig.tiny(
        40, num_layers=4, head_dim=32, qk_norm=True, attention_output_gate=True, partial_rotary_factor=0.25,
        layer_types=("linear_attention",) * 3 + ("full_attention",),
        linear_attention=LinearAttention(num_key_heads=2, num_value_heads=4, key_head_dim=16, value_head_dim=16),
        rope_scaling=YarnRope(factor=4.0, original_max_position_embeddings=64))
    hf = hf_config_from_transformer_config(config)
    assert hf["model_type"] == "qwen3_5_text" and "rope_theta" not in hf
    assert hf["rope_parameters"]["rope_type"] == "yarn" and hf["rope_parameters"]["partial_rotary_factor"] == 0.25
    assert transformer_config_from_hf(hf) == config


def test_the_weight_map_is_the_records():
    """A hybrid folder's tensors are exactly what its record's map names; the dense map, which a
    config alone would not tell apart, names others."""
    from safetensors import safe_open

    with safe_open(HF / "qwen35_text" / "model.safetensors", framework="np") as f:
        keys = set(f.keys())
    config = load_hf_config(HF / "qwen35_text")
    assert set(FAMILIES["qwen3_5_text"].weights(config)) == keys
    assert not set(FAMILIES["qwen3"].weights(config)) <= keys


def _longrope(config: TransformerConfig) -> LongRope:
    half = int(config.head_dim * config.partial_rotary_factor) // 2
    return LongRope(short_factor=(1.0,) * half, long_factor=(2.0,) * half, original_max_position_embeddings=8,
                    max_position_embeddings=40)


def test_phi3_claims_only_what_llamas_block_does_not_compute():
    """A plain config is llama's alone (phi3's block is Llama's with fused weights); partial rotary or
    LongRoPE (phi3's own rope: every other record refuses it) is phi3's alone, windowed or not."""
    plain = TransformerConfig.tiny(40)
    assert infer_family(plain).model_type == "llama"
    assert "phi3 rotates part of each head" in refusal(FAMILIES["phi3"], plain, FAMILIES)
    for changes in (dict(partial_rotary_factor=0.5), dict(sliding_window=16)):
        config = dataclasses.replace(plain, **changes)
        config = dataclasses.replace(config, rope_scaling=_longrope(config))
        assert infer_family(config).model_type == "phi3"
        assert refusal(FAMILIES["llama"], config, FAMILIES) == "llama writes no LongRope (it is phi3's)"
        assert transformer_config_from_hf(hf_config_from_transformer_config(config)) == config


def test_each_soft_cap_is_claimed_by_the_family_that_reads_it():
    """gemma2 varies both caps; gemma3_text the final one only (transformers' Gemma 3 never applies
    the attention cap); every other record keeps Llama's none."""
    gemma2 = load_hf_config(HF / "gemma2")
    gemma3 = load_hf_config(HF / "gemma3_text_softcap")
    assert infer_family(dataclasses.replace(gemma2, attn_logit_softcapping=None)).model_type == "gemma2"
    assert refusal(FAMILIES["gemma3_text"], dataclasses.replace(gemma3, attn_logit_softcapping=3.0), FAMILIES) == (
        "gemma3_text has attn_logit_softcapping=None, this config 3.0")
    assert refusal(FAMILIES["llama"], TransformerConfig.tiny(40, final_logit_softcapping=8.0), FAMILIES) == (
        "llama has final_logit_softcapping=None, this config 8.0")


def test_whether_a_family_fuses_projections_is_its_weight_maps():
    """phi3's record maps q/k/v and gate/up to rows of one tensor each; PEFT refuses adapters of
    those rows only (o_proj's is written)."""
    config = load_hf_config(HF / "phi3")
    keys = set(FAMILIES["phi3"].weights(config))
    assert "model.layers.0.self_attn.qkv_proj.weight[0:64]" in keys
    assert "model.layers.0.mlp.gate_up_proj.weight[128:256]" in keys
    assert not any("[" in key for key in FAMILIES["llama"].weights(config))
    model = add_adapters(load_hf_model(HF / "phi3"), rank=4, alpha=8.0, targets=("o_proj", "down_proj"))
    assert sorted(peft_tensors(model))[0] == "base_model.model.model.layers.0.mlp.down_proj.lora_A.weight"
