"""config.json of a Hugging Face Llama / Qwen2 / Qwen3 checkpoint <-> TransformerConfig.

Both config.json layouts are read: the older one (`rope_theta`, `rope_scaling`)
that most published checkpoints have, and transformers 5's `rope_parameters`.
Anything the model here does not implement (another architecture, sliding
window attention, an o_proj or MLP bias, another rope type, another activation)
is an error naming the file and the field, never silently ignored.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rl_models.config import RUNTIME_FIELDS, LinearAttention, RopeScaling, TransformerConfig

class HFFolderError(ValueError):
    """A file of a Hugging Face folder that cannot be read as a supported model;
    the message names the file and the field, key or value."""


ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "qwen3_5": "Qwen3_5ForConditionalGeneration",
    "qwen3_5_text": "Qwen3_5ForCausalLM",
}


def read_json(path: Path) -> dict[str, Any]:
    """The JSON object in `path`; a missing or malformed file is an error naming it."""
    if not path.is_file():
        found = sorted(p.name for p in path.parent.iterdir()) if path.parent.is_dir() else []
        raise FileNotFoundError(f"{path}: no such file (the folder holds {found})")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise HFFolderError(f"{path}: not valid JSON ({e})") from e
    except UnicodeDecodeError as e:
        raise HFFolderError(f"{path}: not UTF-8 text (byte {e.start}: {e.reason})") from e
    if not isinstance(data, dict):
        raise HFFolderError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def _unsupported(source: str, field: str, value: object, why: str) -> HFFolderError:
    return HFFolderError(f"{source}: unsupported {field}={value!r}: {why}")


def _rope(hf: dict[str, Any], source: str) -> tuple[float, RopeScaling | None]:
    if isinstance(hf.get("rope_parameters"), dict):
        params = dict(hf["rope_parameters"])
        field = "rope_parameters"
        theta = params.get("rope_theta", hf.get("rope_theta", 10000.0))
    else:
        params = dict(hf.get("rope_scaling") or {})
        field = "rope_scaling"
        theta = hf.get("rope_theta", 10000.0)
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type in (None, "default"):
        return float(theta), None
    if rope_type != "llama3":
        raise _unsupported(source, f"{field}.rope_type", rope_type,
                           "supported rope types are 'default' and 'llama3'")
    try:
        scaling = RopeScaling(
            factor=float(params["factor"]),
            low_freq_factor=float(params["low_freq_factor"]),
            high_freq_factor=float(params["high_freq_factor"]),
            original_max_position_embeddings=int(params["original_max_position_embeddings"]),
        )
    except KeyError as e:
        raise HFFolderError(f"{source}: {field} of rope_type 'llama3' lacks {e.args[0]!r}") from e
    except (TypeError, ValueError) as e:
        raise HFFolderError(f"{source}: {field} of rope_type 'llama3': {e}") from e
    return float(theta), scaling


def transformer_config_from_hf(
    hf: dict[str, Any], *, source: str = "config.json", **runtime: Any,
) -> TransformerConfig:
    """The TransformerConfig equivalent to a Hugging Face config.json dict; `runtime` sets
    the fields of `RUNTIME_FIELDS` (dtype, param_dtype, remat, ...), which config.json lacks."""
    unknown = sorted(set(runtime) - set(RUNTIME_FIELDS))
    if unknown:
        raise TypeError(f"transformer_config_from_hf: {unknown} are not runtime fields {RUNTIME_FIELDS}")
    model_type = hf.get("model_type")
    if not isinstance(model_type, str) or model_type not in ARCHITECTURES:
        raise _unsupported(
            source, "model_type", model_type,
            f"supported model_type values: {sorted(ARCHITECTURES)} "
            f"({', '.join(ARCHITECTURES.values())}); architectures={hf.get('architectures')}",
        )
    architectures = hf.get("architectures") or [ARCHITECTURES[model_type]]
    if architectures != [ARCHITECTURES[model_type]]:
        raise _unsupported(source, "architectures", architectures,
                           f"model_type {model_type!r} needs [{ARCHITECTURES[model_type]!r}]")
    if model_type in ("qwen3_5", "qwen3_5_text"):
        return _qwen35_config(hf, model_type, source, runtime)
    if hf.get("hidden_act", "silu") != "silu":
        raise _unsupported(source, "hidden_act", hf["hidden_act"], "only 'silu' (SwiGLU)")
    if hf.get("mlp_bias", False):
        raise _unsupported(source, "mlp_bias", True, "the MLP has no biases here")
    if model_type != "qwen2" and hf.get("attention_bias", False):
        raise _unsupported(source, "attention_bias", True,
                           f"{model_type} puts a bias on o_proj too, which is not implemented")
    if hf.get("use_sliding_window", False):
        raise _unsupported(source, "use_sliding_window", True, "only full attention")
    layer_types = set(hf.get("layer_types") or ["full_attention"])
    if layer_types != {"full_attention"}:
        raise _unsupported(source, "layer_types", sorted(layer_types), "only full attention")
    for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                "num_attention_heads"):
        if key not in hf:
            raise HFFolderError(f"{source}: missing required field {key!r}")
    try:
        theta, scaling = _rope(hf, source)
        return _transformer_config(hf, model_type, theta, scaling, runtime)
    except HFFolderError:
        raise
    except (TypeError, ValueError) as e:  # a field of the wrong type or value, e.g. "hidden_size": "64"
        raise HFFolderError(f"{source}: {e}") from e


def _transformer_config(
    hf: dict[str, Any], model_type: str, theta: float, scaling: RopeScaling | None, runtime: dict[str, Any],
) -> TransformerConfig:
    return TransformerConfig(
        vocab_size=hf["vocab_size"],
        hidden_size=hf["hidden_size"],
        num_layers=hf["num_hidden_layers"],
        num_heads=hf["num_attention_heads"],
        num_kv_heads=hf.get("num_key_value_heads") or hf["num_attention_heads"],
        head_dim=hf.get("head_dim"),
        mlp_hidden_size=hf["intermediate_size"],
        rope_theta=theta,
        rope_scaling=scaling,
        rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
        attention_bias=model_type == "qwen2",
        qk_norm=model_type == "qwen3",
        **runtime,
    )


def _qwen35_config(hf: dict[str, Any], model_type: str, source: str, runtime: dict[str, Any]) -> TransformerConfig:
    """Qwen3.5 dense: the text model's fields (for "qwen3_5", the multimodal folder Qwen3.5 ships
    as, those of `text_config`; the vision tower beside it is not read). Rotary positions are
    Qwen3.5's multimodal rope on text alone: its three position streams are equal there, which is
    the plain rope over the first partial_rotary_factor of each head."""
    text = hf
    if model_type == "qwen3_5":
        text = hf.get("text_config")
        if not isinstance(text, dict):
            raise HFFolderError(f"{source}: model_type 'qwen3_5' needs a 'text_config' object")
        source = f"{source} text_config"
    if text.get("hidden_act", "silu") != "silu":
        raise _unsupported(source, "hidden_act", text["hidden_act"], "only 'silu' (SwiGLU)")
    if text.get("attention_bias", False):
        raise _unsupported(source, "attention_bias", True, "Qwen3.5's attention has no biases here")
    for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim"):
        if key not in text:
            raise HFFolderError(f"{source}: missing required field {key!r}")
    layers = text["num_hidden_layers"]
    interval = text.get("full_attention_interval", 4)
    layer_types = text.get("layer_types") or [
        "linear_attention" if (i + 1) % interval else "full_attention" for i in range(layers)]
    rope = dict(text.get("rope_parameters") or text.get("rope_scaling") or {})
    tie = hf.get("tie_word_embeddings", text.get("tie_word_embeddings", False))
    try:
        theta, scaling = _rope(text, source)
        linear = LinearAttention(
            num_key_heads=text["linear_num_key_heads"], num_value_heads=text["linear_num_value_heads"],
            key_head_dim=text["linear_key_head_dim"], value_head_dim=text["linear_value_head_dim"],
            conv_kernel_size=text.get("linear_conv_kernel_dim", 4),
        )
        return TransformerConfig(
            vocab_size=text["vocab_size"], hidden_size=text["hidden_size"], num_layers=layers,
            num_heads=text["num_attention_heads"],
            num_kv_heads=text.get("num_key_value_heads") or text["num_attention_heads"],
            head_dim=text.get("head_dim", 256), mlp_hidden_size=text["intermediate_size"],
            rope_theta=theta, rope_scaling=scaling,
            partial_rotary_factor=float(rope.get("partial_rotary_factor", text.get("partial_rotary_factor", 0.25))),
            rms_norm_eps=float(text.get("rms_norm_eps", 1e-6)), tie_embeddings=bool(tie), qk_norm=True,
            attention_output_gate=True, layer_types=tuple(layer_types), linear_attention=linear, **runtime,
        )
    except HFFolderError:
        raise
    except (TypeError, ValueError) as e:
        raise HFFolderError(f"{source}: {e}") from e


def infer_model_type(config: TransformerConfig) -> str:
    """The Hugging Face family that computes exactly what `config` computes."""
    if config.hybrid:
        return "qwen3_5_text"
    if config.qk_norm and config.attention_bias:
        raise ValueError(
            "no Hugging Face architecture has both qk_norm and q/k/v-only attention biases"
        )
    if config.qk_norm:
        return "qwen3"
    return "qwen2" if config.attention_bias else "llama"


def hf_config_from_transformer_config(
    config: TransformerConfig, model_type: str | None = None
) -> dict[str, Any]:
    """A config.json dict (older layout, which transformers 4 and 5 both read)."""
    inferred = infer_model_type(config)
    model_type = model_type or inferred
    if model_type != inferred:
        raise ValueError(
            f"model_type={model_type!r} cannot express this config "
            f"(qk_norm={config.qk_norm}, attention_bias={config.attention_bias}); "
            f"it is a {inferred!r} model"
        )
    if model_type == "qwen3_5_text":
        return _qwen35_hf_config(config)
    hf: dict[str, Any] = {
        "architectures": [ARCHITECTURES[model_type]],
        "model_type": model_type,
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "intermediate_size": config.mlp_hidden_size,
        "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_heads,
        "num_key_value_heads": config.num_kv_heads,
        "head_dim": config.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": config.rms_norm_eps,
        "rope_theta": config.rope_theta,
        "rope_scaling": None,
        "tie_word_embeddings": config.tie_embeddings,
        "torch_dtype": config.param_dtype,
    }
    if model_type != "qwen2":
        hf["attention_bias"] = False
    if config.rope_scaling is not None:
        s = config.rope_scaling
        hf["rope_scaling"] = {
            "rope_type": "llama3", "factor": s.factor, "low_freq_factor": s.low_freq_factor,
            "high_freq_factor": s.high_freq_factor,
            "original_max_position_embeddings": s.original_max_position_embeddings,
        }
    return hf


def _qwen35_hf_config(config: TransformerConfig) -> dict[str, Any]:
    """A qwen3_5_text config.json (Qwen3_5ForCausalLM) for a hybrid config."""
    la = config.linear_attention
    assert la is not None
    return {
        "architectures": [ARCHITECTURES["qwen3_5_text"]], "model_type": "qwen3_5_text",
        "vocab_size": config.vocab_size, "hidden_size": config.hidden_size,
        "intermediate_size": config.mlp_hidden_size, "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_heads, "num_key_value_heads": config.num_kv_heads,
        "head_dim": config.head_dim, "hidden_act": "silu", "rms_norm_eps": config.rms_norm_eps,
        "rope_parameters": {"rope_type": "default", "rope_theta": config.rope_theta,
                            "partial_rotary_factor": config.partial_rotary_factor},
        "layer_types": list(config.kinds()), "linear_conv_kernel_dim": la.conv_kernel_size,
        "linear_key_head_dim": la.key_head_dim, "linear_value_head_dim": la.value_head_dim,
        "linear_num_key_heads": la.num_key_heads, "linear_num_value_heads": la.num_value_heads,
        "attention_bias": False, "tie_word_embeddings": config.tie_embeddings, "torch_dtype": config.param_dtype,
    }
