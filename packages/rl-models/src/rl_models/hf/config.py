"""config.json of a Hugging Face checkpoint (rl_models.hf.families) <-> TransformerConfig.

Both config.json layouts are read: the older one (`rope_theta`, `rope_scaling`)
that most published checkpoints have, and transformers 5's `rope_parameters`.
Each family's own fields are read and written by its record (rl_models.hf.families); the code
here names no family. Anything the model here does not implement (another architecture, a
bias flag the family's transformers code lacks, another rope type) is an error naming the
file and the field, never silently ignored.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rl_models.config import RUNTIME_FIELDS, RopeScaling, TransformerConfig
from rl_models.hf.families import ACTIVATION_NAMES, FAMILIES, infer_family
from rl_models.hf.family import LLAMA_BLOCK, Family, FamilyFieldError, refusal
from rl_models.rope_types import DynamicNTKRope, FrequencyRope, LinearRope, LongRope, ProportionalRope, YarnRope


class HFFolderError(ValueError):
    """A file of a Hugging Face folder that cannot be read as a supported model;
    the message names the file and the field, key or value."""


ARCHITECTURES = {model_type: family.architecture for model_type, family in FAMILIES.items()}
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


ROPE_TYPES = ("default", "llama3", "linear", "yarn", "dynamic", "longrope", "proportional")
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
        elif rope_type == "proportional":
            scaling = ProportionalRope(partial_rotary_factor=float(params.get("partial_rotary_factor", 1.0)),
                                       factor=float(params.get("factor", 1.0)))
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


def _biases(hf: dict[str, Any], family: Family, source: str) -> dict[str, bool]:
    """The TransformerConfig bias fields of a family's `attention_bias` / `mlp_bias` (the flags its
    transformers config has, `family.biases`): attention_bias puts a bias on q, k, v and o_proj,
    mlp_bias on gate, up and down. A family with `fixed_biases` has its own (`family.fixes`)."""
    fields: dict[str, bool] = {}
    flags, model_type = family.biases, family.model_type
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


def folder_family(hf: dict[str, Any], source: str = "config.json") -> Family:
    """The record of a config.json's `model_type` (its `architectures` checked against it)."""
    model_type = hf.get("model_type")
    if not isinstance(model_type, str) or model_type not in FAMILIES:
        raise _unsupported(
            source, "model_type", model_type,
            f"supported model_type values: {sorted(ARCHITECTURES)} "
            f"({', '.join(ARCHITECTURES.values())}); architectures={hf.get('architectures')}",
        )
    family = FAMILIES[model_type]
    architectures = hf.get("architectures") or [family.architecture]
    if architectures != [family.architecture]:
        raise _unsupported(source, "architectures", architectures,
                           f"model_type {model_type!r} needs [{family.architecture!r}]")
    return family


def _text_model(hf: dict[str, Any], family: Family, source: str) -> tuple[dict[str, Any], str]:
    """A multimodal folder's text model config (the rest is refused by the weights) and its name in
    errors; tie_word_embeddings is the top level's where it has one (transformers ties by that)."""
    text = hf.get(family.text_config)  # type: ignore[arg-type]
    if not isinstance(text, dict):
        raise HFFolderError(f"{source}: model_type {family.model_type!r} needs a {family.text_config!r} object")
    if "tie_word_embeddings" in hf:
        text = text | {"tie_word_embeddings": hf["tie_word_embeddings"]}
    return text, f"{source} ({family.text_config})"


def transformer_config_from_hf(
    hf: dict[str, Any], *, source: str = "config.json", **runtime: Any,
) -> TransformerConfig:
    """The TransformerConfig equivalent to a Hugging Face config.json dict; `runtime` sets
    the fields of `RUNTIME_FIELDS` (dtype, param_dtype, remat, ...), which config.json lacks."""
    unknown = sorted(set(runtime) - set(RUNTIME_FIELDS))
    if unknown:
        raise TypeError(f"transformer_config_from_hf: {unknown} are not runtime fields {RUNTIME_FIELDS}")
    family = folder_family(hf, source)
    if family.text_config is not None:
        hf, source = _text_model(hf, family, source)
    hf = family.defaults | hf
    activation = hf.get(family.activation_key, "silu")
    if activation not in ACTIVATION_NAMES or (family.activation_key == "hidden_act") != (activation == "silu"):
        want = "'silu' (SwiGLU)" if family.activation_key == "hidden_act" else "'gelu_pytorch_tanh' (GeGLU)"
        raise _unsupported(source, family.activation_key, activation, f"only {want}")
    for key in family.refused:
        if hf.get(key, False):
            raise _unsupported(source, key, hf[key], "only full attention")
    if "layer_types" not in family.varies:
        layer_types = set(hf.get("layer_types") or ["full_attention"])
        if layer_types != {"full_attention"}:
            raise _unsupported(source, "layer_types", sorted(layer_types), "only full attention")
    for key in ("vocab_size", "hidden_size", family.mlp_size_key, "num_hidden_layers",
                "num_attention_heads", *family.required):
        if key not in hf:
            raise HFFolderError(f"{source}: missing required field {key!r}")
    try:
        extra = family.read(hf)
        biases = _biases(hf, family, source)
        theta, scaling, local = _rope(hf, source, family.windows)
        if local is not None and extra.get("sliding_window") is not None:
            extra["rope_local_theta"] = local
        extra["hidden_act"] = ACTIVATION_NAMES[activation]
        return _transformer_config(hf, theta, scaling, dict(family.fixes) | extra | biases, runtime,
                                   family.mlp_size_key)
    except FamilyFieldError as e:
        raise _unsupported(source, e.field, e.value, e.why) from e
    except HFFolderError:
        raise
    except (TypeError, ValueError) as e:  # a field of the wrong type or value, e.g. "hidden_size": "64"
        raise HFFolderError(f"{source}: {e}") from e


def _transformer_config(
    hf: dict[str, Any], theta: float, scaling: Scaling | None, extra: dict[str, Any], runtime: dict[str, Any],
    mlp_size_key: str = "intermediate_size",
) -> TransformerConfig:
    fields: dict[str, Any] = dict(
        vocab_size=hf["vocab_size"],
        hidden_size=hf["hidden_size"],
        num_layers=hf["num_hidden_layers"],
        num_heads=hf["num_attention_heads"],
        num_kv_heads=hf.get("num_key_value_heads") or hf["num_attention_heads"],
        head_dim=hf.get("head_dim"),
        mlp_hidden_size=hf[mlp_size_key],
        rope_theta=theta,
        rope_scaling=scaling,
        rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
    )
    return TransformerConfig(**(fields | extra | runtime))


def export_family(config: TransformerConfig, model_type: str | None = None) -> Family:
    """The record `config` is written as: `model_type`'s, which must claim it, or the one that does."""
    if model_type is None:
        return infer_family(config)
    if model_type not in FAMILIES:
        raise ValueError(f"model_type={model_type!r}: supported model_type values: {sorted(FAMILIES)}")
    why = refusal(FAMILIES[model_type], config, FAMILIES)
    if why is not None:
        raise ValueError(f"model_type={model_type!r} cannot express this config: {why}")
    return FAMILIES[model_type]


def text_model_hf(hf: dict[str, Any], family: Family, config: TransformerConfig) -> dict[str, Any]:
    """A multimodal folder's config.json as its text model's (`family.written_as`), which is what was
    trained and what export writes: the text sub-config, as the text architecture reads it."""
    text = FAMILIES[family.written_as]  # type: ignore[index]
    return hf[family.text_config] | {"architectures": [text.architecture], "model_type": text.model_type,  # type: ignore[index]
                                     "tie_word_embeddings": config.tie_embeddings}


def _rope_scaling(s: Scaling | None) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    """(the rope scaling's config.json object or None, the top-level keys it needs)."""
    if isinstance(s, RopeScaling):
        return {"rope_type": "llama3", "factor": s.factor, "low_freq_factor": s.low_freq_factor,
                "high_freq_factor": s.high_freq_factor,
                "original_max_position_embeddings": s.original_max_position_embeddings}, {}
    if isinstance(s, LinearRope):
        return {"rope_type": "linear", "factor": s.factor}, {}
    if isinstance(s, DynamicNTKRope):
        return {"rope_type": "dynamic", "factor": s.factor}, {"max_position_embeddings": s.max_position_embeddings}
    if isinstance(s, ProportionalRope):
        factor = {} if s.factor == 1.0 else {"factor": s.factor}  # transformers warns of a factor it takes as 1
        return {"rope_type": "proportional", "partial_rotary_factor": s.partial_rotary_factor} | factor, {}
    if isinstance(s, LongRope):
        scaled = {"rope_type": "longrope", "short_factor": list(s.short_factor), "long_factor": list(s.long_factor)}
        scaled |= {k: getattr(s, k) for k in ("factor", "attention_factor") if getattr(s, k) is not None}
        return scaled, {"original_max_position_embeddings": s.original_max_position_embeddings,
                        "max_position_embeddings": s.max_position_embeddings}
    if isinstance(s, YarnRope):
        scaled = {"rope_type": "yarn", "factor": s.factor, "beta_fast": s.beta_fast, "beta_slow": s.beta_slow,
                  "truncate": s.truncate, "original_max_position_embeddings": s.original_max_position_embeddings}
        for key in ("attention_factor", "mscale", "mscale_all_dim"):
            if getattr(s, key) is not None:
                scaled[key] = getattr(s, key)
        return scaled, {"max_position_embeddings": int(s.original_max_position_embeddings * s.factor)}
    return None, {}


def _rope_written(config: TransformerConfig, family: Family) -> dict[str, Any]:
    """The rope's config.json fields in the family's layout: the older one (rope_theta and
    rope_scaling), transformers 5's rope_parameters, or rope_parameters by layer type."""
    scaled, top = _rope_scaling(config.rope_scaling)
    if family.rope_by_layer_type:
        local = config.rope_local_theta or config.rope_theta
        return top | {"rope_parameters": {
            "full_attention": (scaled or {"rope_type": "default"}) | {"rope_theta": config.rope_theta},
            "sliding_attention": {"rope_type": "default", "rope_theta": local}}}
    if family.rope_parameters:
        return top | {"rope_parameters": (scaled or {"rope_type": "default"}) | {
            "rope_theta": config.rope_theta, "partial_rotary_factor": config.partial_rotary_factor}}
    partial = {} if config.partial_rotary_factor == LLAMA_BLOCK["partial_rotary_factor"] else {
        "partial_rotary_factor": config.partial_rotary_factor}
    return top | {"rope_theta": config.rope_theta, "rope_scaling": scaled} | partial


def hf_config_from_transformer_config(
    config: TransformerConfig, model_type: str | None = None
) -> dict[str, Any]:
    """A config.json dict (the family's layout, which transformers 4 and 5 both read) of the family
    `model_type` names, or of the one whose block computes `config`."""
    return family_hf_config(config, export_family(config, model_type))


def family_hf_config(config: TransformerConfig, family: Family) -> dict[str, Any]:
    """`config` as `family`'s config.json (the family claims it: `export_family`)."""
    hf: dict[str, Any] = {
        "architectures": [family.architecture],
        "model_type": family.model_type,
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        family.mlp_size_key: config.mlp_hidden_size,
        "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_heads,
        "num_key_value_heads": config.num_kv_heads,
        "head_dim": config.head_dim,
        "rms_norm_eps": config.rms_norm_eps,
        "tie_word_embeddings": config.tie_embeddings,
        "torch_dtype": config.param_dtype,
    } | _rope_written(config, family)
    if family.activation_key == "hidden_act":
        hf["hidden_act"] = "silu"
    if not family.fixed_biases:
        hf["attention_bias"] = config.attention_out_bias  # with q/k/v biases (its record's claim checked)
    if config.mlp_bias:
        hf["mlp_bias"] = True
    return hf | family.write(config)
