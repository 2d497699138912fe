"""config.json of a Hugging Face checkpoint (rl_models.hf.families) <-> TransformerConfig.

Both config.json layouts are read: the older one (`rope_theta`, `rope_scaling`)
that most published checkpoints have, and transformers 5's `rope_parameters`.
Each family's own fields are read by rl_models.hf.families. Anything the model here
does not implement (another architecture, a bias flag the family's transformers code
lacks, another rope type) is an error naming the file and the field, never silently ignored.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rl_models.config import RUNTIME_FIELDS, LinearAttention, RopeScaling, TransformerConfig
from rl_models.hf.families import ACTIVATION_NAMES, FAMILIES, Family, FamilyFieldError, infer_family
from rl_models.rope_types import DynamicNTKRope, FrequencyRope, LinearRope, LongRope, YarnRope

class HFFolderError(ValueError):
    """A file of a Hugging Face folder that cannot be read as a supported model;
    the message names the file and the field, key or value."""


HYBRID_ARCHITECTURES = {"qwen3_5": "Qwen3_5ForConditionalGeneration", "qwen3_5_text": "Qwen3_5ForCausalLM"}
"""The hybrid (linear-attention) model_types: rl_models.hybrid, read by _qwen35_config."""
ARCHITECTURES = {model_type: family.architecture for model_type, family in FAMILIES.items()} | HYBRID_ARCHITECTURES
"""Every supported model_type -> its architecture class (rl_models.hf.families)."""


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


ROPE_TYPES = ("default", "llama3", "linear", "yarn", "dynamic", "longrope")
"""Rope types read ("dynamic" and "longrope" recompute their frequencies from each call's longest
position, as transformers does: rl_models.rope_types.DynamicNTKRope, LongRope)."""
Scaling = RopeScaling | FrequencyRope


def _rope_params(hf: dict[str, Any], windows: bool) -> tuple[str, dict[str, Any], float, float | None]:
    """(field named in errors, the global rope's parameters, its theta, the windowed layers' theta or None)."""
    params = hf.get("rope_parameters")
    local = hf.get("rope_local_base_freq")
    if isinstance(params, dict) and windows and isinstance(params.get("full_attention"), dict):
        # per layer type (Gemma 3 as transformers 5 writes it)
        sliding = dict(params.get("sliding_attention") or {})
        if sliding.get("rope_type", "default") != "default":
            raise HFFolderError(f"rope_parameters.sliding_attention.rope_type={sliding['rope_type']!r}: "
                                "the windowed layers' rope is read unscaled only")
        full = dict(params["full_attention"])
        theta = full.get("rope_theta", hf.get("rope_theta", 10000.0))
        return "rope_parameters.full_attention", full, theta, sliding.get("rope_theta", local)
    if isinstance(params, dict):
        return "rope_parameters", dict(params), params.get("rope_theta", hf.get("rope_theta", 10000.0)), local
    return "rope_scaling", dict(hf.get("rope_scaling") or {}), hf.get("rope_theta", 10000.0), local


def _rope(hf: dict[str, Any], source: str, windows: bool
          ) -> tuple[float, Scaling | None, float | None]:
    field, params, theta, local = _rope_params(hf, windows)
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type in (None, "default"):
        return float(theta), None, None if local is None else float(local)
    if rope_type not in ROPE_TYPES:
        raise _unsupported(source, f"{field}.rope_type", rope_type,
                           f"supported rope types are {list(ROPE_TYPES)}")
    original = params.get("original_max_position_embeddings", hf.get("max_position_embeddings"))
    try:
        if rope_type == "linear":
            scaling: Scaling = LinearRope(factor=float(params["factor"]))
        elif rope_type == "dynamic":
            if hf.get("max_position_embeddings") is None:
                raise HFFolderError(f"{source}: {field} of rope_type 'dynamic' needs max_position_embeddings "
                                    "(the length up to which it is the default rope)")
            scaling = DynamicNTKRope(factor=float(params["factor"]),
                                     max_position_embeddings=int(hf["max_position_embeddings"]))
        elif rope_type == "longrope":
            scaling = _longrope(hf, params, source, field)
        elif rope_type == "yarn":
            optional = {k: params[k] for k in ("beta_fast", "beta_slow", "attention_factor", "mscale",
                                               "mscale_all_dim") if params.get(k) is not None}
            factor = params.get("factor") or hf["max_position_embeddings"] / original
            scaling = YarnRope(factor=float(factor), original_max_position_embeddings=int(original),
                               truncate=bool(params.get("truncate", True)),
                               **{k: float(v) for k, v in optional.items()})
        else:
            scaling = RopeScaling(
                factor=float(params["factor"]),
                low_freq_factor=float(params["low_freq_factor"]),
                high_freq_factor=float(params["high_freq_factor"]),
                original_max_position_embeddings=int(params["original_max_position_embeddings"]),
            )
    except KeyError as e:
        raise HFFolderError(f"{source}: {field} of rope_type {rope_type!r} lacks {e.args[0]!r}") from e
    except (TypeError, ValueError) as e:
        raise HFFolderError(f"{source}: {field} of rope_type {rope_type!r}: {e}") from e
    return float(theta), scaling, None if local is None else float(local)


def _longrope(hf: dict[str, Any], params: dict[str, Any], source: str, field: str) -> LongRope:
    """LongRoPE's factor lists; its original context from config.json's top level first (where Phi-3
    keeps it, and where transformers takes it from first), then the rope's parameters."""
    original = hf.get("original_max_position_embeddings", params.get("original_max_position_embeddings"))
    if original is None or hf.get("max_position_embeddings") is None:
        raise HFFolderError(f"{source}: {field} of rope_type 'longrope' needs original_max_position_embeddings and "
                            "max_position_embeddings")
    optional = {k: float(params[k]) for k in ("factor", "attention_factor") if params.get(k) is not None}
    return LongRope(short_factor=tuple(params["short_factor"]), long_factor=tuple(params["long_factor"]),
                    original_max_position_embeddings=int(original),
                    max_position_embeddings=int(hf["max_position_embeddings"]), **optional)


def _having(flag: str) -> str:
    return ", ".join(sorted(name for name, family in FAMILIES.items() if flag in family.biases))


def _biases(hf: dict[str, Any], model_type: str, family: Family, source: str) -> dict[str, bool]:
    """The TransformerConfig bias fields of a family's `attention_bias` / `mlp_bias` (the flags its
    transformers config has, `family.biases`): attention_bias puts a bias on q, k, v and o_proj,
    mlp_bias on gate, up and down. A family with `fixed_biases` reads its own (not these flags)."""
    fields: dict[str, bool] = {}
    flags = family.biases
    if hf.get("attention_bias", False) and not family.fixed_biases:
        if "attention_bias" not in flags:
            raise _unsupported(source, "attention_bias", hf["attention_bias"],
                               f"{model_type}'s attention has no biases in transformers (families with "
                               f"attention_bias: {_having('attention_bias')})")
        fields |= {"attention_bias": True, "attention_out_bias": True}
    if hf.get("mlp_bias", False):
        if "mlp_bias" not in flags:
            raise _unsupported(source, "mlp_bias", hf["mlp_bias"], f"{model_type}'s MLP has no biases in "
                               f"transformers (families with mlp_bias: {_having('mlp_bias')})")
        fields["mlp_bias"] = True
    return fields


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
    if model_type in HYBRID_ARCHITECTURES:
        return _qwen35_config(hf, model_type, source, runtime)
    family = FAMILIES[model_type]
    if family.text_config is not None:  # a multimodal folder: its text model (the rest is refused by the weights)
        text = hf.get(family.text_config)
        if not isinstance(text, dict):
            raise HFFolderError(f"{source}: model_type {model_type!r} needs a {family.text_config!r} object")
        hf, source = text, f"{source} ({family.text_config})"
    hf = family.defaults | hf
    activation = hf.get(family.activation_key, "silu")
    if activation not in ACTIVATION_NAMES or (family.activation_key == "hidden_act") != (activation == "silu"):
        want = "'silu' (SwiGLU)" if family.activation_key == "hidden_act" else "'gelu_pytorch_tanh' (GeGLU)"
        raise _unsupported(source, family.activation_key, activation, f"only {want}")
    biases = _biases(hf, model_type, family, source)
    for key in family.refused:
        if hf.get(key, False):
            raise _unsupported(source, key, hf[key], "only full attention")
    if not family.windows:
        layer_types = set(hf.get("layer_types") or ["full_attention"])
        if layer_types != {"full_attention"}:
            raise _unsupported(source, "layer_types", sorted(layer_types), "only full attention")
    for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                "num_attention_heads"):
        if key not in hf:
            raise HFFolderError(f"{source}: missing required field {key!r}")
    try:
        extra = family.read(hf)
        theta, scaling, local = _rope(hf, source, family.windows)
        if local is not None and extra.get("sliding_window") is not None:
            extra["rope_local_theta"] = local
        extra["hidden_act"] = ACTIVATION_NAMES[activation]
        extra |= biases
        return _transformer_config(hf, model_type, theta, scaling, extra, runtime)
    except FamilyFieldError as e:
        raise _unsupported(source, e.field, e.value, e.why) from e
    except HFFolderError:
        raise
    except (TypeError, ValueError) as e:  # a field of the wrong type or value, e.g. "hidden_size": "64"
        raise HFFolderError(f"{source}: {e}") from e


def _transformer_config(
    hf: dict[str, Any], model_type: str, theta: float, scaling: Scaling | None,
    extra: dict[str, Any], runtime: dict[str, Any],
) -> TransformerConfig:
    fields: dict[str, Any] = dict(
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
    )
    return TransformerConfig(**(fields | extra | runtime))


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
        theta, scaling, _ = _rope(text, source, False)
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
    return infer_family(config)


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
        hf["attention_bias"] = config.attention_out_bias  # with q/k/v biases (infer_model_type checked)
    if config.mlp_bias:
        hf["mlp_bias"] = True
    s = config.rope_scaling
    if isinstance(s, RopeScaling):
        hf["rope_scaling"] = {
            "rope_type": "llama3", "factor": s.factor, "low_freq_factor": s.low_freq_factor,
            "high_freq_factor": s.high_freq_factor,
            "original_max_position_embeddings": s.original_max_position_embeddings,
        }
    elif isinstance(s, LinearRope):
        hf["rope_scaling"] = {"rope_type": "linear", "factor": s.factor}
    elif isinstance(s, DynamicNTKRope):
        hf["rope_scaling"] = {"rope_type": "dynamic", "factor": s.factor}
        hf["max_position_embeddings"] = s.max_position_embeddings
    elif isinstance(s, LongRope):
        hf["rope_scaling"] = {"rope_type": "longrope", "short_factor": list(s.short_factor),
                              "long_factor": list(s.long_factor)}
        hf["rope_scaling"] |= {k: getattr(s, k) for k in ("factor", "attention_factor") if getattr(s, k) is not None}
        hf["original_max_position_embeddings"] = s.original_max_position_embeddings
        hf["max_position_embeddings"] = s.max_position_embeddings
    elif isinstance(s, YarnRope):
        hf["rope_scaling"] = {"rope_type": "yarn", "factor": s.factor, "beta_fast": s.beta_fast,
                              "beta_slow": s.beta_slow, "truncate": s.truncate,
                              "original_max_position_embeddings": s.original_max_position_embeddings}
        hf["max_position_embeddings"] = int(s.original_max_position_embeddings * s.factor)
        for key in ("attention_factor", "mscale", "mscale_all_dim"):
            if getattr(s, key) is not None:
                hf["rope_scaling"][key] = getattr(s, key)
    family = FAMILIES[model_type]
    written = family.write(config)
    if family.rope_by_layer_type:
        scaled = hf.pop("rope_scaling") or {"rope_type": "default"}
        hf["rope_parameters"] = {
            "full_attention": scaled | {"rope_theta": hf.pop("rope_theta")},
            "sliding_attention": {"rope_type": "default", "rope_theta": config.rope_local_theta or config.rope_theta}}
    if family.activation_key != "hidden_act":
        del hf["hidden_act"]
    return hf | written


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
