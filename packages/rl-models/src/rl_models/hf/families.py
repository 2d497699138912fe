"""The supported Hugging Face families: one `Family` record each (rl_models.hf.family), in FAMILIES.

A record reads its own config.json fields (windows, NoPE layers, experts, Qwen3.5's linear-attention
layers, Qwen3.5-MoE's both) into TransformerConfig fields and writes them back, fixes the fields its block always has
(Gemma's and OLMo 2's norms and scales, Qwen2's biases, Qwen3's q/k norm), and says which configs
its block computes; the fields every family shares (sizes, rope, tied embeddings) are read in
`rl_models.hf.config`. A field a family's folders may set that the model here does not implement
is refused there or here, naming the file and the field. Adding a family is adding its record here.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from rl_models.config import LinearAttention, TransformerConfig
from rl_models.hf.family import Family, FamilyFieldError, claimant, named
from rl_models.hf.weight_maps import fused_parameter_map, hybrid_parameter_map, layered_parameter_map
from rl_models.rope_types import LongRope


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
    """Gemma 3's windows and scales; `final_logit_softcapping` when a folder sets it (Gemma 3
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
    return fields | caps | {"query_scale": float(hf.get("query_pre_attn_scalar", head_dim)) ** -0.5}


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
    return {"num_experts": experts, "experts_per_token": hf["num_experts_per_tok"],
            "moe_hidden_size": hf["moe_intermediate_size"], "norm_topk_prob": bool(hf.get("norm_topk_prob", False))}


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
        "num_experts": experts, "experts_per_token": k, "moe_hidden_size": hf["intermediate_size"],
        "swiglu_limit": float(hf.get("swiglu_limit", 7.0)), "swiglu_alpha": float(hf.get("swiglu_alpha", 1.702))}


def _write_gpt_oss(config: TransformerConfig) -> dict[str, Any]:
    """The expert and window fields; the experts' weights are written unquantised (float)."""
    return _write_windows(config) | {
        "attention_bias": True, "num_local_experts": config.num_experts,
        "num_experts_per_tok": config.experts_per_token, "experts_per_token": config.experts_per_token,
        "intermediate_size": config.moe_hidden_size, "swiglu_limit": config.swiglu_limit,
        "swiglu_alpha": config.swiglu_alpha, "router_aux_loss_coef": 0.0, "output_router_logits": False}


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
    return windows


def _write_olmo2(config: TransformerConfig) -> dict[str, Any]:
    """No special ids: the class's defaults (OLMo 2's own, 50279 for eos) lie outside most vocabularies."""
    return {"pad_token_id": None, "bos_token_id": None, "eos_token_id": None}


def _write_olmo3(config: TransformerConfig) -> dict[str, Any]:
    return _write_windows(config) | _write_olmo2(config)


def _read_phi3(hf: dict[str, Any]) -> dict[str, Any]:
    """Partial rotary (rope_parameters' or the top level's partial_rotary_factor; Phi-4-mini's 0.75)
    and Mistral's windows (every layer), a window no shorter than max_position_embeddings being
    none (Phi-4-mini's 262144 over 131072 positions). Its fused q/k/v and gate/up: its weight map."""
    rope = hf.get("rope_parameters") if isinstance(hf.get("rope_parameters"), dict) else {}
    partial = rope.get("partial_rotary_factor", hf.get("partial_rotary_factor", 1.0))
    window = hf.get("sliding_window")
    if window is not None and hf.get("max_position_embeddings") is not None and window >= hf["max_position_embeddings"]:
        hf = hf | {"sliding_window": None}
    return _windows(hf, "sliding_attention") | {"partial_rotary_factor": float(partial)}


def _write_phi3(config: TransformerConfig) -> dict[str, Any]:
    """The window (every layer's); no special ids: the class's defaults (Phi-3's 32000) lie outside
    most vocabularies. partial_rotary_factor is written with the rope (rl_models.hf.config)."""
    return {"sliding_window": config.sliding_window, "pad_token_id": None, "bos_token_id": None, "eos_token_id": None}


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
    caps = {cap: float(hf[cap]) for cap in SOFTCAPS if hf.get(cap) is not None}
    return _windows(hf, "sliding_attention") | caps | {
        "query_scale": float(hf.get("query_pre_attn_scalar", head_dim)) ** -0.5}


def _write_gemma2(config: TransformerConfig) -> dict[str, Any]:
    assert config.query_scale is not None
    return _write_windows(config) | {
        "query_pre_attn_scalar": _number(config.query_scale ** -2), "hidden_activation": "gelu_pytorch_tanh",
        "attn_logit_softcapping": config.attn_logit_softcapping,
        "final_logit_softcapping": config.final_logit_softcapping}


def _gemma4_shapes(hf: dict[str, Any], types: list[str]) -> dict[str, Any]:
    """The full-attention layers' head size and KV heads: `per_layer_config` as transformers 5
    writes it (the same override on every full-attention layer, none on a windowed one), else
    `global_head_dim` (512 unless set) and, with attention_k_eq_v, `num_global_key_value_heads`."""
    per_layer = hf.get("per_layer_config")
    if per_layer is None:
        kv = hf.get("num_global_key_value_heads") if hf.get("attention_k_eq_v", False) else None
        return {"global_head_dim": hf.get("global_head_dim", 512), "global_kv_heads": kv}
    overrides = {int(k): v for k, v in per_layer.items()} if isinstance(per_layer, dict) else None
    full = {i for i, t in enumerate(types) if t == "full_attention"}
    shapes = {tuple(sorted(v.items())) for v in (overrides or {}).values() if isinstance(v, dict)}
    if overrides is None or set(overrides) != full or len(shapes) != 1 or not {
            k for k, _ in next(iter(shapes))} <= {"head_dim", "num_key_value_heads"}:
        raise FamilyFieldError("per_layer_config", per_layer, "must give every full-attention layer, and only "
                               "those, the same head_dim and num_key_value_heads")
    shape = dict(next(iter(shapes)))
    return {"global_head_dim": shape.get("head_dim", hf.get("head_dim")),
            "global_kv_heads": shape.get("num_key_value_heads")}


def _read_gemma4(hf: dict[str, Any]) -> dict[str, Any]:
    """Gemma 4's text model: windowed and global layers (five to one unless layer_types says, the
    last always global, as transformers forces it), the global layers' own head size and KV heads
    and their keys as values, KV shared by the last layers (their MLP double-wide with
    use_double_wide_mlp), per-layer inputs and the final soft-cap. The MoE block is not implemented."""
    if hf.get("enable_moe_block", False):
        raise FamilyFieldError("enable_moe_block", hf["enable_moe_block"], "Gemma 4's mixture-of-experts block "
                               "(experts beside each layer's MLP) is not implemented")
    if hf.get("use_bidirectional_attention") is not None:
        raise FamilyFieldError("use_bidirectional_attention", hf["use_bidirectional_attention"], "only causal attention")
    n = hf["num_hidden_layers"]
    types = list(hf.get("layer_types") or ["sliding_attention" if (i + 1) % 6 else "full_attention"
                                           for i in range(n)])
    types[-1] = "full_attention"
    shapes = _gemma4_shapes(hf, types)
    head_dim = hf.get("head_dim") or hf["hidden_size"] // hf["num_attention_heads"]
    if shapes["global_head_dim"] == head_dim:
        shapes["global_head_dim"] = None
    caps = {} if hf.get("final_logit_softcapping") is None else {
        "final_logit_softcapping": float(hf["final_logit_softcapping"])}
    return _windows(hf | {"layer_types": types}, "sliding_attention") | shapes | caps | {
        "keys_as_values": bool(hf.get("attention_k_eq_v", False)),
        "kv_shared_layers": int(hf.get("num_kv_shared_layers", 0)),
        "wide_shared_mlp": bool(hf.get("use_double_wide_mlp", False)) and bool(hf.get("num_kv_shared_layers", 0)),
        "per_layer_input_size": int(hf.get("hidden_size_per_layer_input") or 0),
        "per_layer_vocab_size": hf.get("vocab_size_per_layer_input") if hf.get("hidden_size_per_layer_input") else None}


def _write_gemma4(config: TransformerConfig) -> dict[str, Any]:
    """Gemma 4's own keys; the global layers' shape as `per_layer_config`, as transformers 5 writes it."""
    shape = {"head_dim": config.global_head_dim or config.head_dim}
    if config.global_kv_heads is not None:
        shape["num_key_value_heads"] = config.global_kv_heads
    return _write_windows(config) | {
        "hidden_activation": "gelu_pytorch_tanh", "final_logit_softcapping": config.final_logit_softcapping,
        "attention_k_eq_v": config.keys_as_values, "num_kv_shared_layers": config.kv_shared_layers,
        "hidden_size_per_layer_input": config.per_layer_input_size,
        "vocab_size_per_layer_input": config.per_layer_vocab_size or config.vocab_size,
        "enable_moe_block": False, "use_double_wide_mlp": config.wide_shared_mlp, "use_bidirectional_attention": None,
        "per_layer_config": {str(i): shape for i, w in enumerate(config.windowed()) if not w}}


def _read_qwen35(hf: dict[str, Any]) -> dict[str, Any]:
    """Qwen3.5 (dense): Gated DeltaNet layers with a gated full-attention layer every
    full_attention_interval-th (layer_types when a folder has them). Rotary positions are Qwen3.5's
    multimodal rope on text alone: its three position streams are equal there, which is the plain
    rope over the first partial_rotary_factor of each head."""
    if hf.get("attention_bias", False):
        raise FamilyFieldError("attention_bias", hf["attention_bias"], "Qwen3.5's attention has no biases here")
    n, interval = hf["num_hidden_layers"], hf.get("full_attention_interval", 4)
    types = hf.get("layer_types") or ["linear_attention" if (i + 1) % interval else "full_attention" for i in range(n)]
    rope = dict(hf.get("rope_parameters") or hf.get("rope_scaling") or {})
    linear = LinearAttention(
        num_key_heads=hf["linear_num_key_heads"], num_value_heads=hf["linear_num_value_heads"],
        key_head_dim=hf["linear_key_head_dim"], value_head_dim=hf["linear_value_head_dim"],
        conv_kernel_size=hf.get("linear_conv_kernel_dim", 4))
    return {"layer_types": tuple(types), "linear_attention": linear,
            "partial_rotary_factor": float(rope.get("partial_rotary_factor", hf.get("partial_rotary_factor", 0.25)))}


def _write_qwen35(config: TransformerConfig) -> dict[str, Any]:
    la = config.linear_attention
    assert la is not None
    return {"layer_types": list(config.kinds()), "linear_conv_kernel_dim": la.conv_kernel_size,
            "linear_key_head_dim": la.key_head_dim, "linear_value_head_dim": la.value_head_dim,
            "linear_num_key_heads": la.num_key_heads, "linear_num_value_heads": la.num_value_heads}


def _read_qwen35_moe(hf: dict[str, Any]) -> dict[str, Any]:
    """Qwen3.5's hybrid with experts in every layer: softmax over the experts, the top k always
    renormalised, and a shared expert (shared_expert_intermediate_size, read as the dense MLP's
    width) scaled by sigmoid(shared_expert_gate(x))."""
    experts = hf.get("num_experts")
    if not isinstance(experts, int) or isinstance(experts, bool) or experts <= 0:
        raise FamilyFieldError("num_experts", experts, "must be a positive int")
    for key in ("num_experts_per_tok", "moe_intermediate_size"):
        if key not in hf:
            raise FamilyFieldError(key, None, "is required with experts")
    return _read_qwen35(hf) | {"num_experts": experts, "experts_per_token": hf["num_experts_per_tok"],
                               "moe_hidden_size": hf["moe_intermediate_size"]}


def _write_qwen35_moe(config: TransformerConfig) -> dict[str, Any]:
    return _write_qwen35(config) | {"num_experts": config.num_experts, "num_experts_per_tok": config.experts_per_token,
                                    "moe_intermediate_size": config.moe_hidden_size, "router_aux_loss_coef": 0.0,
                                    "output_router_logits": False}


def _claims_mistral(config: TransformerConfig) -> str | None:
    if config.sliding_window is None or not all(config.windowed()):
        return "mistral windows every layer (a sliding_window and no full-attention layer_types)"
    return None


def _claims_ministral(config: TransformerConfig) -> str | None:
    if config.sliding_window is None or all(config.windowed()):
        return "ministral mixes windowed and full-attention layers (layer_types)"
    return None


def _olmo_block(config: TransformerConfig) -> str | None:
    if not (config.post_norms and config.qk_norm and config.qk_norm_all_heads):
        return ("only OLMo 2 and 3 (olmo2, olmo3) have norms after the sub-layers alone and q/k norms over all "
                "heads, and they have both (post_norms, qk_norm, qk_norm_all_heads)")
    return None


def _claims_olmo2(config: TransformerConfig) -> str | None:
    if config.rope_local_theta is not None:
        return "OLMo 2 (full attention) has no local rope theta"
    return _olmo_block(config)


def _claims_olmo3(config: TransformerConfig) -> str | None:
    if config.sliding_window is None:
        return "olmo3 windows three layers in four (sliding_window)"
    if config.rope_local_theta is None:
        return ("OLMo 3 (windowed layers) gives its windowed layers their own unscaled rope: "
                "set rope_local_theta (Olmo 3's is rope_theta)")
    return _olmo_block(config)


def _claims_smollm3(config: TransformerConfig) -> str | None:
    return None if config.nope_layers else "smollm3 has layers without rotary positions (nope_layers)"


def _claims_gemma3(config: TransformerConfig) -> str | None:
    if config.query_scale is None:
        return "gemma3_text scales its scores by query_pre_attn_scalar ** -0.5 (query_scale)"
    return None


def _claims_gemma2(config: TransformerConfig) -> str | None:
    if config.query_scale is None:
        return "gemma2 scales its scores by query_pre_attn_scalar ** -0.5 (query_scale)"
    return None


def _claims_phi3(config: TransformerConfig) -> str | None:
    if config.partial_rotary_factor == 1.0 and not isinstance(config.rope_scaling, LongRope):
        return ("phi3 rotates part of each head or scales its rope by LongRoPE (partial_rotary_factor, "
                "rope_scaling), without which its block is llama's")
    if config.sliding_window is not None and not all(config.windowed()):
        return "phi3 windows every layer or none (a sliding_window and no full-attention layer_types)"
    return None


def _claims_qwen3_moe(config: TransformerConfig) -> str | None:
    return None if config.num_experts else "qwen3_moe has experts (num_experts)"


def _claims_qwen35(config: TransformerConfig) -> str | None:
    return None if config.hybrid else "qwen3_5_text has linear-attention layers (layer_types)"


def _claims_qwen35_moe(config: TransformerConfig) -> str | None:
    if not config.hybrid:
        return "qwen3_5_moe_text has linear-attention layers (layer_types)"
    return None if config.num_experts else "qwen3_5_moe_text has experts (num_experts)"


def _claims_gemma4(config: TransformerConfig) -> str | None:
    if config.sliding_window is None or all(config.windowed()):
        return "gemma4_text mixes windowed and full-attention layers (layer_types)"
    return None


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

GEMMA4_DEFAULTS: dict[str, Any] = {
    "vocab_size": 262_144, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 30,
    "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh",
    "rms_norm_eps": 1e-6, "tie_word_embeddings": True, "sliding_window": 512, "vocab_size_per_layer_input": 262_144,
    "hidden_size_per_layer_input": 256, "rope_parameters": {
        "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
        "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1_000_000.0}},
}
"""transformers' Gemma4TextConfig defaults (5.x)."""

GEMMA4_BLOCK: dict[str, Any] = {"hidden_act": "gelu_tanh", "sandwich_norms": True, "embed_scale": True, "qk_norm": True,
                                "value_norm": True, "query_scale": 1.0, "layer_scalars": True}
"""Gemma 4's GeGLU, plain (w, not 1 + w) norms before and after each sub-layer, scaled embeddings,
q/k norms and an unscaled norm on the values (so scores are not scaled), each block's layer_scalar."""

GEMMA_BLOCK: dict[str, Any] = {"hidden_act": "gelu_tanh", "norm_plus_one": True, "sandwich_norms": True,
                               "embed_scale": True}
"""Gemma 2's and 3's GeGLU, (1 + w) norms before and after each sub-layer and scaled embeddings."""

OLMO_BLOCK: dict[str, Any] = {"post_norms": True, "qk_norm": True, "qk_norm_all_heads": True}
"""OLMo 2's and 3's norms after the attention and the MLP only (post_attention_layernorm and
post_feedforward_layernorm), q/k norms over all heads' projections."""


ATTENTION_BIAS = ("attention_bias",)
BOTH_BIASES = ("attention_bias", "mlp_bias")
WINDOWS = ("sliding_window", "layer_types")
EXPERTS = ("num_experts", "experts_per_token", "moe_hidden_size")
SOFTCAPS = ("attn_logit_softcapping", "final_logit_softcapping")

GEMMA3_TEXT = Family(
    "Gemma3ForCausalLM", _read_gemma3, _write_gemma3, activation_key="hidden_activation", windows=True,
    defaults=GEMMA3_DEFAULTS, biases=ATTENTION_BIAS, claims=_claims_gemma3, fixes=GEMMA_BLOCK | {"qk_norm": True},
    varies=(*WINDOWS, "rope_local_theta", "query_scale", "final_logit_softcapping"))
QWEN35_TEXT = Family(
    "Qwen3_5ForCausalLM", _read_qwen35, _write_qwen35, defaults={"head_dim": 256}, claims=_claims_qwen35,
    fixes={"qk_norm": True, "attention_output_gate": True},
    varies=("layer_types", "linear_attention", "partial_rotary_factor"),
    required=("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim"),
    rope_parameters=True, weights=hybrid_parameter_map,
    ignored_keys=r"(model\.visual|mtp)\..*")  # the vision tower and the multi-token-prediction head

QWEN35_MOE_TEXT = replace(
    QWEN35_TEXT, architecture="Qwen3_5MoeForCausalLM", read=_read_qwen35_moe, write=_write_qwen35_moe,
    mlp_size_key="shared_expert_intermediate_size", claims=_claims_qwen35_moe,
    fixes=dict(QWEN35_TEXT.fixes) | {"router": "softmax_topk", "norm_topk_prob": True, "shared_expert": True},
    varies=(*QWEN35_TEXT.varies, *EXPERTS),
    required=(*QWEN35_TEXT.required, "num_experts", "num_experts_per_tok", "moe_intermediate_size"))

FAMILIES: dict[str, Family] = named({
    "llama": Family("LlamaForCausalLM", refused=("use_sliding_window",), biases=BOTH_BIASES),
    "qwen2": Family("Qwen2ForCausalLM", refused=("use_sliding_window",), fixed_biases=True,
                    fixes={"attention_bias": True, "attention_out_bias": False}),
    "qwen3": Family("Qwen3ForCausalLM", refused=("use_sliding_window",), biases=ATTENTION_BIAS,
                    fixes={"qk_norm": True}),
    "qwen3_moe": Family("Qwen3MoeForCausalLM", _read_qwen3_moe, _write_qwen3_moe, refused=("use_sliding_window",),
                        biases=ATTENTION_BIAS, fixes={"qk_norm": True, "router": "softmax_topk"},
                        varies=(*EXPERTS, "norm_topk_prob"), claims=_claims_qwen3_moe),
    "gpt_oss": Family("GptOssForCausalLM", _read_gpt_oss, _write_gpt_oss, windows=True, fixed_biases=True,
                      fixes={"attention_bias": True, "attention_out_bias": True, "attention_sinks": True,
                             "router": "topk_softmax", "norm_topk_prob": False, "router_bias": True,
                             "expert_bias": True},
                      varies=(*WINDOWS, *EXPERTS, "swiglu_limit", "swiglu_alpha")),
    "mistral": Family("MistralForCausalLM", _read_mistral, _write_mistral, windows=True, varies=WINDOWS,
                      claims=_claims_mistral),
    "ministral": Family("MinistralForCausalLM", _read_mistral, _write_windows, windows=True, varies=WINDOWS,
                        claims=_claims_ministral),
    "olmo2": Family("Olmo2ForCausalLM", write=_write_olmo2, fixes=OLMO_BLOCK, claims=_claims_olmo2),
    "phi3": Family("Phi3ForCausalLM", _read_phi3, _write_phi3, windows=True, defaults=PHI3_DEFAULTS,
                   varies=(*WINDOWS, "partial_rotary_factor"), claims=_claims_phi3, own_ropes=(LongRope,),
                   weights=fused_parameter_map),
    "gemma2": Family("Gemma2ForCausalLM", _read_gemma2, _write_gemma2, activation_key="hidden_activation",
                     windows=True, defaults=GEMMA2_DEFAULTS, biases=ATTENTION_BIAS, fixes=GEMMA_BLOCK,
                     varies=(*WINDOWS, "query_scale", *SOFTCAPS), claims=_claims_gemma2),
    "olmo3": Family("Olmo3ForCausalLM", _read_olmo3, _write_olmo3, windows=True, rope_by_layer_type=True,
                    defaults=OLMO3_DEFAULTS, fixes=OLMO_BLOCK, varies=(*WINDOWS, "rope_local_theta"),
                    claims=_claims_olmo3),
    "smollm3": Family("SmolLM3ForCausalLM", _read_smollm3, _write_smollm3, defaults={"tie_word_embeddings": True},
                      biases=BOTH_BIASES, varies=("nope_layers",), claims=_claims_smollm3),
    "gemma3_text": GEMMA3_TEXT,
    "gemma3": replace(GEMMA3_TEXT, architecture="Gemma3ForConditionalGeneration", text_config="text_config",
                      written_as="gemma3_text", ignored_keys=r"(model\.)?(vision_tower|multi_modal_projector)\..*"),
    "gemma4_text": Family("Gemma4ForCausalLM", _read_gemma4, _write_gemma4, activation_key="hidden_activation",
                          windows=True, rope_by_layer_type=True, defaults=GEMMA4_DEFAULTS, fixes=GEMMA4_BLOCK,
                          varies=(*WINDOWS, "rope_local_theta", "final_logit_softcapping", "global_head_dim",
                                  "global_kv_heads", "keys_as_values", "kv_shared_layers", "per_layer_input_size",
                                  "per_layer_vocab_size", "wide_shared_mlp"),
                          claims=_claims_gemma4, weights=layered_parameter_map),
    "qwen3_5_text": QWEN35_TEXT,
    "qwen3_5": replace(QWEN35_TEXT, architecture="Qwen3_5ForConditionalGeneration", text_config="text_config",
                       written_as="qwen3_5_text"),
    "qwen3_5_moe_text": QWEN35_MOE_TEXT,
    "qwen3_5_moe": replace(QWEN35_MOE_TEXT, architecture="Qwen3_5MoeForConditionalGeneration",
                           text_config="text_config", written_as="qwen3_5_moe_text"),
})
"""Every supported model_type -> its record."""

ACTIVATION_NAMES = {"silu": "silu", "gelu_pytorch_tanh": "gelu_tanh"}
"""config.json activation -> TransformerConfig.hidden_act."""


def infer_family(config: TransformerConfig) -> Family:
    """The family whose block computes what `config` computes, its biases included: the one record
    that claims it (ValueError listing each record's refusal when none does)."""
    return claimant(config, FAMILIES)
