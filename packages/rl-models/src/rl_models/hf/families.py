"""What each supported Hugging Face family's config.json says beyond the Llama block.

A `Family` reads its own fields (windows, NoPE layers, Gemma's and OLMo 2's norms and scales) into
TransformerConfig fields and writes them back; the fields every family shares (sizes, rope,
tied embeddings) are read in `rl_models.hf.config`. A field a family's folders may set that
the model here does not implement is refused there or here, naming the file and the field.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rl_models.config import TransformerConfig
from rl_models.rope_types import LongRope


class FamilyFieldError(ValueError):
    """A family field the model does not implement: (field, value, why)."""

    def __init__(self, field: str, value: object, why: str):
        super().__init__(field, value, why)
        self.field, self.value, self.why = field, value, why


def _no_fields(hf: dict[str, Any]) -> dict[str, Any]:
    return {}


def _nothing_written(config: TransformerConfig) -> dict[str, Any]:
    return {}


@dataclass(frozen=True)
class Family:
    """One `model_type`: its architecture class name and its own config.json fields."""

    architecture: str
    """The `architectures` entry transformers writes for it."""
    read: Callable[[dict[str, Any]], dict[str, Any]] = _no_fields
    """config.json (the text part) -> the TransformerConfig fields only this family sets."""
    write: Callable[[TransformerConfig], dict[str, Any]] = _nothing_written
    """TransformerConfig -> the config.json fields only this family writes."""
    activation_key: str = "hidden_act"
    """The config.json key naming the MLP's activation."""
    windows: bool = False
    """Whether its folders may window layers (`sliding_window`, `layer_types`)."""
    text_config: str | None = None
    """A multimodal folder's key holding the text model's config (Gemma 3's "text_config")."""
    refused: tuple[str, ...] = field(default=())
    """config.json keys that must be absent or false (a setting not implemented)."""
    biases: tuple[str, ...] = field(default=())
    """The bias flags its transformers config class has: "attention_bias" (q, k, v and o_proj)
    and "mlp_bias" (gate, up and down); a flag it lacks must be absent or false."""
    fixed_biases: bool = False
    """Its attention biases are the family's own, not a flag's (Qwen2's q/k/v, gpt-oss's q/k/v/o): an
    `attention_bias` key in its folder says nothing, and it has no MLP biases."""
    rope_by_layer_type: bool = False
    """Its config.json is written with `rope_parameters` by layer type (full_attention with the
    scaling, sliding_attention unscaled), as transformers 5 writes Olmo 3's."""
    defaults: dict[str, Any] = field(default_factory=dict)
    """What transformers' config class assumes for keys a folder leaves out (Gemma 3's
    text_config lists only what differs from them)."""


def _windows(hf: dict[str, Any], default_type: str) -> dict[str, Any]:
    """sliding_window and layer_types; with a window and no layer_types every layer is `default_type`."""
    window = hf.get("sliding_window")
    types = hf.get("layer_types")
    if window is None:
        if types is not None and set(types) != {"full_attention"}:
            raise FamilyFieldError("layer_types", sorted(set(types)), "sliding_attention layers need a sliding_window")
        return {}
    if types is None:
        types = [default_type] * hf["num_hidden_layers"]
    if not isinstance(window, int) or isinstance(window, bool) or window <= 0:
        raise FamilyFieldError("sliding_window", window, "must be null or a positive int")
    return {"sliding_window": window, "layer_types": tuple(types)}


def _read_mistral(hf: dict[str, Any]) -> dict[str, Any]:
    return _windows(hf, "sliding_attention")


def _write_mistral(config: TransformerConfig) -> dict[str, Any]:
    """Only the window: transformers takes a Mistral config.json with layer_types for Ministral."""
    return {"sliding_window": config.sliding_window}


def _write_windows(config: TransformerConfig) -> dict[str, Any]:
    return {"sliding_window": config.sliding_window, "layer_types": [
        "sliding_attention" if w else "full_attention" for w in config.windowed()]}


def _read_smollm3(hf: dict[str, Any]) -> dict[str, Any]:
    """`no_rope_layers`: 1 where a layer uses rope, 0 where it does not (every fourth by default)."""
    n = hf["num_hidden_layers"]
    flags = hf.get("no_rope_layers")
    if flags is None:
        interval = hf.get("no_rope_layer_interval", 4)
        flags = [int((i + 1) % interval != 0) for i in range(n)]
    if not isinstance(flags, list) or len(flags) != n or not set(flags) <= {0, 1}:
        raise FamilyFieldError("no_rope_layers", flags, f"must be {n} flags of 0 (no rope) or 1")
    if hf.get("use_sliding_window", False):
        raise FamilyFieldError("use_sliding_window", True, "SmolLM3's windowed layers are not implemented")
    return {"nope_layers": tuple(i for i, f in enumerate(flags) if f == 0)}


def _write_smollm3(config: TransformerConfig) -> dict[str, Any]:
    nope = set(config.nope_layers)
    # no special ids: the class's defaults (Llama 3's) lie outside most vocabularies
    return {"no_rope_layers": [0 if i in nope else 1 for i in range(config.num_layers)],
            "use_sliding_window": False, "sliding_window": None,
            "pad_token_id": None, "bos_token_id": None, "eos_token_id": None}


def _read_gemma3(hf: dict[str, Any]) -> dict[str, Any]:
    """Gemma 3's windows, norms and scales; `final_logit_softcapping` when a folder sets it (Gemma 3
    folders set null). `attn_logit_softcapping` is not read: transformers' Gemma 3 (5.x) keeps it in
    its config but never passes it to its attention, so a folder's value changes nothing there."""
    caps = {} if hf.get("final_logit_softcapping") is None else {
        "final_logit_softcapping": float(hf["final_logit_softcapping"])}
    if hf.get("use_bidirectional_attention", False):
        raise FamilyFieldError("use_bidirectional_attention", True, "only causal attention")
    pattern = hf.get("sliding_window_pattern", hf.get("_sliding_window_pattern", 6))
    n = hf["num_hidden_layers"]
    if hf.get("layer_types") is None and hf.get("sliding_window") is not None:
        hf = hf | {"layer_types": ["full_attention" if (i + 1) % pattern == 0 else "sliding_attention"
                                   for i in range(n)]}
    fields = _windows(hf, "sliding_attention")
    head_dim = hf.get("head_dim") or hf["hidden_size"] // hf["num_attention_heads"]
    fields |= {"norm_plus_one": True, "sandwich_norms": True, "embed_scale": True, "qk_norm": True,
               "query_scale": float(hf.get("query_pre_attn_scalar", head_dim)) ** -0.5}
    return fields | caps


def _number(x: float) -> int | float:
    """x as config.json holds it: an int when it is one (to 6 decimals; transformers checks the type)."""
    x = round(x, 6)
    return int(x) if x == int(x) else x


def _write_gemma3(config: TransformerConfig) -> dict[str, Any]:
    assert config.query_scale is not None
    return _write_windows(config) | {
        "query_pre_attn_scalar": _number(config.query_scale ** -2),
        "rope_local_base_freq": config.rope_local_theta if config.rope_local_theta is not None else config.rope_theta,
        "attn_logit_softcapping": None, "final_logit_softcapping": config.final_logit_softcapping,
        "hidden_activation": "gelu_pytorch_tanh",
    }


def _read_qwen3_moe(hf: dict[str, Any]) -> dict[str, Any]:
    """Experts in every layer (decoder_sparse_step 1, no mlp_only_layers, as every published
    Qwen3-MoE): softmax over the experts, the top k, renormalised with norm_topk_prob."""
    experts = hf.get("num_experts", hf.get("num_local_experts"))
    if not isinstance(experts, int) or isinstance(experts, bool) or experts <= 0:
        raise FamilyFieldError("num_experts", experts, "must be a positive int")
    n, step, dense = hf["num_hidden_layers"], hf.get("decoder_sparse_step", 1), hf.get("mlp_only_layers") or []
    if not isinstance(step, int) or step < 1:
        raise FamilyFieldError("decoder_sparse_step", step, "must be a positive int")
    mixed = [i for i in range(n) if i in dense or (i + 1) % step]
    if mixed:
        field, value = ("mlp_only_layers", dense) if dense else ("decoder_sparse_step", step)
        raise FamilyFieldError(field, value, f"layers {mixed} would have a dense MLP; only experts in every "
                               "layer are implemented (every published Qwen3-MoE has them)")
    for key in ("num_experts_per_tok", "moe_intermediate_size"):
        if key not in hf:
            raise FamilyFieldError(key, None, "is required with experts")
    return {"qk_norm": True, "num_experts": experts, "experts_per_token": hf["num_experts_per_tok"],
            "moe_hidden_size": hf["moe_intermediate_size"], "router": "softmax_topk",
            "norm_topk_prob": bool(hf.get("norm_topk_prob", False))}


def _write_qwen3_moe(config: TransformerConfig) -> dict[str, Any]:
    return {"num_experts": config.num_experts, "num_experts_per_tok": config.experts_per_token,
            "moe_intermediate_size": config.moe_hidden_size, "norm_topk_prob": config.norm_topk_prob,
            "decoder_sparse_step": 1, "mlp_only_layers": [], "use_sliding_window": False, "sliding_window": None}


def _read_gpt_oss(hf: dict[str, Any]) -> dict[str, Any]:
    """Attention sinks, q/k/v/o biases, windowed and full layers alternating (layer_types; the
    windowed first when a folder leaves them out), experts with biases and the clamped SwiGLU, a
    router with a bias that takes the top k logits, then a softmax over them."""
    n = hf["num_hidden_layers"]
    if hf.get("layer_types") is None and hf.get("sliding_window") is not None:
        hf = hf | {"layer_types": ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(n)]}
    quant = hf.get("quantization_config") or {}
    if quant and quant.get("quant_method") != "mxfp4":
        raise FamilyFieldError("quantization_config.quant_method", quant.get("quant_method"),
                               "only MXFP4 (dequantised at load) is read")
    experts = hf.get("num_local_experts")
    k = hf.get("num_experts_per_tok", hf.get("experts_per_token"))
    if not isinstance(experts, int) or isinstance(experts, bool) or experts <= 0:
        raise FamilyFieldError("num_local_experts", experts, "must be a positive int")
    return _windows(hf, "sliding_attention") | {
        "attention_bias": True, "attention_out_bias": True, "attention_sinks": True, "num_experts": experts,
        "experts_per_token": k, "moe_hidden_size": hf["intermediate_size"], "router": "topk_softmax",
        "norm_topk_prob": False, "router_bias": True, "expert_bias": True,
        "swiglu_limit": float(hf.get("swiglu_limit", 7.0)), "swiglu_alpha": float(hf.get("swiglu_alpha", 1.702))}


def _write_gpt_oss(config: TransformerConfig) -> dict[str, Any]:
    """The expert and window fields; the experts' weights are written unquantised (float)."""
    return _write_windows(config) | {
        "attention_bias": True, "num_local_experts": config.num_experts,
        "num_experts_per_tok": config.experts_per_token, "experts_per_token": config.experts_per_token,
        "intermediate_size": config.moe_hidden_size, "swiglu_limit": config.swiglu_limit,
        "swiglu_alpha": config.swiglu_alpha, "router_aux_loss_coef": 0.0, "output_router_logits": False}


def _read_olmo2(hf: dict[str, Any]) -> dict[str, Any]:
    """Norms after the attention and the MLP only (post_attention_layernorm and
    post_feedforward_layernorm), q/k norms over all heads' projections."""
    return {"post_norms": True, "qk_norm": True, "qk_norm_all_heads": True}


def _read_olmo3(hf: dict[str, Any]) -> dict[str, Any]:
    """OLMo 2's block with three windowed layers to one global (layer_types; transformers' pattern
    when a folder leaves them out); the windowed layers' rope is the default one (rl_models.hf.config
    reads its theta from rope_parameters.sliding_attention; with the older layout, rope_theta)."""
    n = hf["num_hidden_layers"]
    if hf.get("layer_types") is None and hf.get("sliding_window") is not None:
        hf = hf | {"layer_types": ["sliding_attention" if (i + 1) % 4 else "full_attention" for i in range(n)]}
    windows = _windows(hf, "sliding_attention")
    if windows:
        windows["rope_local_theta"] = float(hf.get("rope_theta", OLMO3_DEFAULTS["rope_theta"]))
    return windows | _read_olmo2(hf)


def _write_olmo2(config: TransformerConfig) -> dict[str, Any]:
    """No special ids: the class's defaults (OLMo 2's own, 50279 for eos) lie outside most vocabularies."""
    return {"pad_token_id": None, "bos_token_id": None, "eos_token_id": None}


def _write_olmo3(config: TransformerConfig) -> dict[str, Any]:
    return _write_windows(config) | _write_olmo2(config)


def _read_phi3(hf: dict[str, Any]) -> dict[str, Any]:
    """Partial rotary (rope_parameters' or the top level's partial_rotary_factor; Phi-4-mini's 0.75)
    and Mistral's windows (every layer), a window no shorter than max_position_embeddings being
    none (Phi-4-mini's 262144 over 131072 positions). Fused q/k/v and gate/up: rl_models.hf.weights."""
    rope = hf.get("rope_parameters") if isinstance(hf.get("rope_parameters"), dict) else {}
    partial = rope.get("partial_rotary_factor", hf.get("partial_rotary_factor", 1.0))
    window = hf.get("sliding_window")
    if window is not None and hf.get("max_position_embeddings") is not None and window >= hf["max_position_embeddings"]:
        hf = hf | {"sliding_window": None}
    return _windows(hf, "sliding_attention") | {"partial_rotary_factor": float(partial)}


def _write_phi3(config: TransformerConfig) -> dict[str, Any]:
    """No special ids: the class's defaults (Phi-3's 32000) lie outside most vocabularies."""
    return {"partial_rotary_factor": config.partial_rotary_factor, "sliding_window": config.sliding_window,
            "pad_token_id": None, "bos_token_id": None, "eos_token_id": None}


def _read_gemma2(hf: dict[str, Any]) -> dict[str, Any]:
    """Gemma 3's block without q/k norms or a local theta (every layer the one rope), windowed and
    global layers alternating (the windowed first when a folder leaves out layer_types), and both
    soft-caps, which transformers' Gemma 2 applies (30 on the logits and 50 on the attention scores
    unless a folder says otherwise; null: none)."""
    if hf.get("use_bidirectional_attention", False):
        raise FamilyFieldError("use_bidirectional_attention", True, "only causal attention")
    if hf.get("layer_types") is None and hf.get("sliding_window") is not None:
        hf = hf | {"layer_types": ["sliding_attention" if (i + 1) % 2 else "full_attention"
                                   for i in range(hf["num_hidden_layers"])]}
    head_dim = hf.get("head_dim") or hf["hidden_size"] // hf["num_attention_heads"]
    caps = {cap: float(hf[cap]) for cap in ("attn_logit_softcapping", "final_logit_softcapping")
            if hf.get(cap) is not None}
    return _windows(hf, "sliding_attention") | caps | {
        "norm_plus_one": True, "sandwich_norms": True, "embed_scale": True,
        "query_scale": float(hf.get("query_pre_attn_scalar", head_dim)) ** -0.5}


def _write_gemma2(config: TransformerConfig) -> dict[str, Any]:
    assert config.query_scale is not None
    return _write_windows(config) | {
        "query_pre_attn_scalar": _number(config.query_scale ** -2), "hidden_activation": "gelu_pytorch_tanh",
        "attn_logit_softcapping": config.attn_logit_softcapping,
        "final_logit_softcapping": config.final_logit_softcapping}


GEMMA2_DEFAULTS: dict[str, Any] = {
    "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh", "rms_norm_eps": 1e-6, "tie_word_embeddings": True,
    "query_pre_attn_scalar": 256, "sliding_window": 4096, "final_logit_softcapping": 30.0,
    "attn_logit_softcapping": 50.0,
}
"""transformers' Gemma2Config defaults (5.x) a folder may leave out."""

PHI3_DEFAULTS: dict[str, Any] = {"rms_norm_eps": 1e-5, "max_position_embeddings": 4096,
                                 "original_max_position_embeddings": 4096}
"""transformers' Phi3Config defaults (5.x) a folder may leave out."""

OLMO3_DEFAULTS: dict[str, Any] = {"rope_theta": 500_000.0, "sliding_window": 4096}
"""transformers' Olmo3Config defaults (5.x) a folder may leave out."""

GEMMA3_DEFAULTS: dict[str, Any] = {
    "vocab_size": 262_208, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
    "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh",
    "rms_norm_eps": 1e-6, "tie_word_embeddings": True, "query_pre_attn_scalar": 256, "sliding_window": 4096,
    "rope_theta": 1_000_000.0, "rope_local_base_freq": 10_000.0,
}
"""transformers' Gemma3TextConfig defaults (5.x)."""

ATTENTION_BIAS = ("attention_bias",)
BOTH_BIASES = ("attention_bias", "mlp_bias")

FAMILIES: dict[str, Family] = {
    "llama": Family("LlamaForCausalLM", refused=("use_sliding_window",), biases=BOTH_BIASES),
    "qwen2": Family("Qwen2ForCausalLM", refused=("use_sliding_window",), fixed_biases=True),
    "qwen3": Family("Qwen3ForCausalLM", refused=("use_sliding_window",), biases=ATTENTION_BIAS),
    "qwen3_moe": Family("Qwen3MoeForCausalLM", _read_qwen3_moe, _write_qwen3_moe, refused=("use_sliding_window",),
                        biases=ATTENTION_BIAS),
    "gpt_oss": Family("GptOssForCausalLM", _read_gpt_oss, _write_gpt_oss, windows=True, fixed_biases=True),
    "mistral": Family("MistralForCausalLM", _read_mistral, _write_mistral, windows=True),
    "ministral": Family("MinistralForCausalLM", _read_mistral, _write_windows, windows=True),
    "olmo2": Family("Olmo2ForCausalLM", _read_olmo2, _write_olmo2),
    "phi3": Family("Phi3ForCausalLM", _read_phi3, _write_phi3, windows=True, defaults=PHI3_DEFAULTS),
    "gemma2": Family("Gemma2ForCausalLM", _read_gemma2, _write_gemma2, activation_key="hidden_activation",
                     windows=True, defaults=GEMMA2_DEFAULTS, biases=ATTENTION_BIAS),
    "olmo3": Family("Olmo3ForCausalLM", _read_olmo3, _write_olmo3, windows=True, rope_by_layer_type=True,
                    defaults=OLMO3_DEFAULTS),
    "smollm3": Family("SmolLM3ForCausalLM", _read_smollm3, _write_smollm3, defaults={"tie_word_embeddings": True},
                      biases=BOTH_BIASES),
    "gemma3_text": Family("Gemma3ForCausalLM", _read_gemma3, _write_gemma3, activation_key="hidden_activation",
                          windows=True, defaults=GEMMA3_DEFAULTS, biases=ATTENTION_BIAS),
    "gemma3": Family("Gemma3ForConditionalGeneration", _read_gemma3, _write_gemma3,
                     activation_key="hidden_activation", windows=True, text_config="text_config",
                     defaults=GEMMA3_DEFAULTS, biases=ATTENTION_BIAS),
}

ACTIVATION_NAMES = {"silu": "silu", "gelu_pytorch_tanh": "gelu_tanh"}
"""config.json activation -> TransformerConfig.hidden_act."""


def infer_family(config: TransformerConfig) -> str:
    """The model_type whose block computes what `config` computes (Gemma 3, OLMo 2, SmolLM3, Mistral,
    Qwen3, Qwen2, Llama), its biases included; ValueError when none does."""
    name = _family_of_block(config)
    if config.attn_logit_softcapping is not None and name != "gemma2":
        raise ValueError(f"attention soft-capping is Gemma 2's (transformers' Gemma 3 does not apply it), and this "
                         f"config is {name}'s")
    if config.final_logit_softcapping is not None and name not in ("gemma2", "gemma3_text"):
        raise ValueError(f"final logit soft-capping is Gemma 2's and 3's, and this config is {name}'s")
    if FAMILIES[name].fixed_biases:  # checked by _family_of_block
        if config.mlp_bias:
            raise ValueError(f"{name} has no MLP biases")
        return name
    biases = FAMILIES[name].biases
    if config.attention_bias or config.attention_out_bias:
        if "attention_bias" not in biases:
            raise ValueError(f"{name} has no attention biases")
        if not (config.attention_bias and config.attention_out_bias):
            raise ValueError(f"{name}'s attention_bias puts biases on q, k, v and o_proj together; "
                             f"this config has attention_bias={config.attention_bias}, "
                             f"attention_out_bias={config.attention_out_bias}")
    if config.mlp_bias and "mlp_bias" not in biases:
        raise ValueError(f"{name} has no MLP biases (only llama's and smollm3's mlp_bias)")
    return name


def _family_of_block(config: TransformerConfig) -> str:
    """The model_type whose block (biases aside but for Qwen2's q/k/v-only ones) is `config`'s."""
    if config.partial_rotary_factor != 1.0 or isinstance(config.rope_scaling, LongRope):
        phi3 = not (config.qk_norm or config.attention_bias or config.attention_out_bias or config.mlp_bias
                    or config.num_experts or config.sandwich_norms or config.post_norms or config.norm_plus_one
                    or config.embed_scale or config.nope_layers or config.query_scale is not None
                    or config.rope_local_theta is not None or config.hidden_act != "silu" or config.layer_types)
        if not phi3:
            raise ValueError("partial rotary and LongRoPE are written as Phi-3 (phi3), which has Llama's block "
                             "without biases, q/k norms or other per-layer settings")
        return "phi3"
    if config.post_norms or config.qk_norm_all_heads:
        olmo = config.post_norms and config.qk_norm and config.qk_norm_all_heads
        if not olmo or config.norm_plus_one or config.embed_scale or config.hidden_act != "silu" \
                or config.nope_layers or config.query_scale is not None or config.num_experts or config.attention_sinks:
            raise ValueError("only OLMo 2 and 3 (olmo2, olmo3) have norms after the sub-layers alone and q/k norms "
                             "over all heads, and they have both, with Llama's norms and SwiGLU")
        if config.sliding_window is None:
            if config.rope_local_theta is not None:
                raise ValueError("OLMo 2 (full attention) has no local rope theta")
            return "olmo2"
        if config.rope_local_theta is None:
            raise ValueError("OLMo 3 (windowed layers) gives its windowed layers their own unscaled rope: "
                             "set rope_local_theta (Olmo 3's is rope_theta)")
        return "olmo3"
    if config.attention_sinks or config.expert_bias:
        gpt_oss = (config.attention_sinks and config.expert_bias and config.router_bias and config.attention_bias
                   and config.attention_out_bias and config.router == "topk_softmax" and not config.qk_norm
                   and config.hidden_act == "silu" and not (config.sandwich_norms or config.nope_layers))
        if not gpt_oss:
            raise ValueError("attention sinks and expert biases are gpt-oss's, and it has both with q/k/v/o and "
                             "router biases, a top-k-then-softmax router and no q/k norm")
        return "gpt_oss"
    if config.num_experts:
        if config.router != "softmax_topk" or not config.qk_norm or config.attention_bias != config.attention_out_bias \
                or config.sliding_window \
                or config.nope_layers or config.sandwich_norms or config.norm_plus_one or config.embed_scale \
                or config.hidden_act != "silu" or config.query_scale is not None:
            raise ValueError("with experts only Qwen3-MoE is written: a softmax-then-top-k router, q/k norm, "
                             "full attention, no biases but q/k/v/o ones, Llama's norms and SwiGLU")
        return "qwen3_moe"
    if config.sandwich_norms or config.norm_plus_one or config.embed_scale or config.hidden_act != "silu":
        gemma = config.sandwich_norms and config.norm_plus_one and config.embed_scale
        if gemma and not config.qk_norm and config.rope_local_theta is None and config.hidden_act == "gelu_tanh" \
                and not config.nope_layers:
            return "gemma2"
        if not (gemma and config.qk_norm) or config.hidden_act != "gelu_tanh" or config.nope_layers:
            raise ValueError("only Gemma 2 and 3 (gemma2, gemma3_text) have (1 + w) norms, sandwich norms, scaled "
                             "embeddings and GeGLU, and they have all of them (Gemma 3 with q/k norm, Gemma 2 "
                             "without q/k norm or a local theta)")
        return "gemma3_text"
    if config.rope_local_theta is not None or config.query_scale is not None:
        raise ValueError("a local rope theta or a query scale is Gemma 3's, which this config is not")
    if config.nope_layers:
        if config.sliding_window is not None or config.qk_norm:
            raise ValueError("SmolLM3 (NoPE layers) has no windows or q/k norm here")
        return "smollm3"
    if config.sliding_window is not None:
        if config.qk_norm:
            raise ValueError("Mistral (windowed layers) has no q/k norm")
        return "mistral" if all(config.windowed()) else "ministral"
    qkv_only = config.attention_bias and not config.attention_out_bias
    if config.qk_norm and qkv_only:
        raise ValueError("no Hugging Face architecture has both qk_norm and q/k/v-only attention biases")
    if config.qk_norm:
        return "qwen3"
    return "qwen2" if qkv_only else "llama"
