"""Where each tensor of a Hugging Face checkpoint lives in the NNX params: a family's weight map
(rl_models.hf.family.Family.weights) is a function of the config giving every key's `Slot`.

The dense map serves every family of the Llama block (its biases, norms and experts by the
config's fields); the fused map is the dense one with q/k/v and gate/up each one tensor (Phi-3);
Qwen3.5's hybrid map places its two kinds of layers in their own stacks.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from rl_models.config import TransformerConfig
from rl_models.gemma4 import layer_rows

Path_ = tuple[str | int, ...]

_TAKE = re.compile(r"(.+)\[(\d+)::(\d+)\]")
"""A key naming every step-th column of a tensor from start on, `<key>[start::step]` (gpt-oss
interleaves each expert's gate and up columns in one gate_up_proj)."""


_ROWS = re.compile(r"(.+)\[(\d+):(\d+)\]")
"""A key naming rows start..stop of a tensor's first axis, `<key>[start:stop]` (Phi-3's fused
qkv_proj and gate_up_proj hold q, k and v, or gate and up, one after the other)."""


_LAYER_KEY = re.compile(r"(.*layers\.\d+\.)(.+)")
"""(a layer's prefix, the rest) of a weight map's key."""


def split_key(key: str) -> tuple[str, int, int]:
    """(the tensor's key, first column, column step) of a weight map's key."""
    m = _TAKE.fullmatch(key)
    if m:
        return m.group(1), int(m.group(2)), int(m.group(3))
    rows = _ROWS.fullmatch(key)
    return (rows.group(1), 0, 1) if rows else (key, 0, 1)


def row_range(key: str) -> tuple[int, int] | None:
    """(start, stop) of a `<key>[start:stop]` weight map key's rows; None for a whole tensor."""
    m = _ROWS.fullmatch(key)
    return (int(m.group(2)), int(m.group(3))) if m else None


class Slot(NamedTuple):
    """Where a Hugging Face tensor lives in the NNX params."""

    path: Path_  # the param's path in the model's state
    layer: int | None  # index on the stacked layer axis, or None for unstacked params
    transposed: bool  # HF Linear weights are [out, in]; kernels here are [in, out]
    offset: float = 0.0  # added on reading, taken off on writing: Qwen3.5's (1 + w) norms hold 1 + w here
    expert: int | None = None  # index on the expert axis (after the layer's) of an expert weight

    def index(self) -> tuple[int, ...]:
        """The leading indices of the param that the tensor fills."""
        return tuple(i for i in (self.layer, self.expert) if i is not None)


def dense_parameter_map(config: TransformerConfig, prefix: str = "model.", head: str = "lm_head.weight"
                        ) -> dict[str, Slot]:
    """Hugging Face key -> its Slot. Layer i's tensors are row i of the stacked
    `layers` params. `prefix` and `head`: the text model's keys (see TEXT_LAYOUTS)."""
    names: dict[str, Slot] = {f"{prefix}embed_tokens.weight": Slot(("embed",), None, False)}
    # the block's norms: Llama's two, Gemma's four (each sub-layer's input and output), or OLMo 2's
    # two after the sub-layers (Llama's name for the MLP's input norm is its attention's output norm)
    norms = {"input_layernorm": "attn_norm", "post_attention_layernorm": "mlp_norm"}
    if config.post_norms:
        norms = {"post_attention_layernorm": "attn_post_norm", "post_feedforward_layernorm": "mlp_post_norm"}
    if config.sandwich_norms:
        norms = {"input_layernorm": "attn_norm", "post_attention_layernorm": "attn_post_norm",
                 "pre_feedforward_layernorm": "mlp_norm", "post_feedforward_layernorm": "mlp_post_norm"}
    for i in range(config.num_layers):
        hf = f"{prefix}layers.{i}"

        def at(*path: str, transposed: bool = False, i: int = i) -> Slot:
            return Slot(("layers", *path), i, transposed)

        for name, ours in norms.items():
            names[f"{hf}.{name}.weight"] = at(ours, "weight")
        for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
            names[f"{hf}.self_attn.{proj}.weight"] = at("attn", proj, "kernel", transposed=True)
        if config.attention_bias:
            for proj in ("q_proj", "k_proj", "v_proj"):
                names[f"{hf}.self_attn.{proj}.bias"] = at("attn", proj, "bias")
        if config.qk_norm:
            for norm in ("q_norm", "k_norm"):
                names[f"{hf}.self_attn.{norm}.weight"] = at("attn", norm, "weight")
        if config.attention_out_bias:
            names[f"{hf}.self_attn.o_proj.bias"] = at("attn", "o_proj", "bias")
        if config.attention_sinks:
            names[f"{hf}.self_attn.sinks"] = at("attn", "sinks")
        if config.num_experts and config.expert_bias:  # as gpt-oss ships them: every expert in one tensor
            names[f"{hf}.mlp.router.weight"] = at("mlp", "router", "kernel", transposed=True)
            names[f"{hf}.mlp.router.bias"] = at("mlp", "router", "bias")
            experts = f"{hf}.mlp.experts"
            for ours, key in (("gate_proj", "gate_up_proj[0::2]"), ("up_proj", "gate_up_proj[1::2]"),
                              ("gate_bias", "gate_up_proj_bias[0::2]"), ("up_bias", "gate_up_proj_bias[1::2]"),
                              ("down_proj", "down_proj"), ("down_bias", "down_proj_bias")):
                names[f"{experts}.{key}"] = at("mlp", ours)
            continue
        if config.num_experts:  # as Qwen3-MoE ships them: a router and one tensor per expert and projection
            names[f"{hf}.mlp.gate.weight"] = at("mlp", "router", "kernel", transposed=True)
            for e in range(config.num_experts):
                for proj in ("gate_proj", "up_proj", "down_proj"):
                    names[f"{hf}.mlp.experts.{e}.{proj}.weight"] = Slot(("layers", "mlp", proj), i, True, expert=e)
            continue
        for proj in ("gate_proj", "up_proj", "down_proj"):
            names[f"{hf}.mlp.{proj}.weight"] = at("mlp", proj, "kernel", transposed=True)
            if config.mlp_bias:
                names[f"{hf}.mlp.{proj}.bias"] = at("mlp", proj, "bias")
    names[f"{prefix}norm.weight"] = Slot(("final_norm", "weight"), None, False)
    if not config.tie_embeddings:
        names[head] = Slot(("lm_head", "kernel"), None, True)
    return names


def fused_parameter_map(config: TransformerConfig, prefix: str = "model.", head: str = "lm_head.weight"
                        ) -> dict[str, Slot]:
    """The dense map with q, k and v as rows of one `qkv_proj` (q's H * Dh rows, then k's and v's
    K * Dh each) and gate and up as rows of one `gate_up_proj` (gate's first), as Phi-3 ships them."""
    q, kv = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim  # type: ignore[operator]
    f = config.mlp_hidden_size
    fused = {"self_attn.q_proj.weight": f"self_attn.qkv_proj.weight[0:{q}]",
             "self_attn.k_proj.weight": f"self_attn.qkv_proj.weight[{q}:{q + kv}]",
             "self_attn.v_proj.weight": f"self_attn.qkv_proj.weight[{q + kv}:{q + 2 * kv}]",
             "mlp.gate_proj.weight": f"mlp.gate_up_proj.weight[0:{f}]",
             "mlp.up_proj.weight": f"mlp.gate_up_proj.weight[{f}:{2 * f}]"}
    names = {}
    for key, slot in dense_parameter_map(config, prefix, head).items():
        layer = _LAYER_KEY.fullmatch(key)
        names[layer.group(1) + fused[layer.group(2)] if layer and layer.group(2) in fused else key] = slot
    return names


def hybrid_parameter_map(config: TransformerConfig, prefix: str = "model.", head: str = "lm_head.weight"
                         ) -> dict[str, Slot]:
    """Qwen3.5's keys (under `prefix`: "model." or the multimodal folder's "model.language_model.")
    -> their Slots: the k-th linear-attention layer is row k of `linear_layers`, the k-th
    full-attention layer row k of `layers`; with experts (Qwen3.5-MoE) each layer's MLP is
    Qwen3-MoE's layout plus the shared expert. Every RMSNorm but the linear attention's gated one
    scales by (1 + w): its weight is stored here as 1 + w."""
    names: dict[str, Slot] = {f"{prefix}embed_tokens.weight": Slot(("embed",), None, False),
                              f"{prefix}norm.weight": Slot(("final_norm", "weight"), None, False, 1.0)}
    counts = {"linear_attention": 0, "full_attention": 0}
    for i, kind in enumerate(config.kinds()):
        hf, j = f"{prefix}layers.{i}", counts[kind]
        counts[kind] += 1
        stack = "linear_layers" if kind == "linear_attention" else "layers"

        def at(*path: str, transposed: bool = False, offset: float = 0.0, j: int = j, stack: str = stack) -> Slot:
            return Slot((stack, *path), j, transposed, offset)

        names[f"{hf}.input_layernorm.weight"] = at("attn_norm", "weight", offset=1.0)
        names[f"{hf}.post_attention_layernorm.weight"] = at("mlp_norm", "weight", offset=1.0)
        if config.num_experts:  # Qwen3.5-MoE: a router, one tensor per expert and projection, the shared expert
            names[f"{hf}.mlp.gate.weight"] = at("mlp", "router", "kernel", transposed=True)
            for e in range(config.num_experts):
                for proj in ("gate_proj", "up_proj", "down_proj"):
                    names[f"{hf}.mlp.experts.{e}.{proj}.weight"] = Slot((stack, "mlp", proj), j, True, expert=e)
            for proj in ("gate_proj", "up_proj", "down_proj"):
                names[f"{hf}.mlp.shared_expert.{proj}.weight"] = at("mlp", "shared_expert", proj, "kernel",
                                                                    transposed=True)
            names[f"{hf}.mlp.shared_expert_gate.weight"] = at("mlp", "shared_expert_gate", "kernel", transposed=True)
        else:
            for proj in ("gate_proj", "up_proj", "down_proj"):
                names[f"{hf}.mlp.{proj}.weight"] = at("mlp", proj, "kernel", transposed=True)
        if kind == "linear_attention":
            for proj in ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "out_proj"):
                names[f"{hf}.linear_attn.{proj}.weight"] = at("linear_attn", proj, "kernel", transposed=True)
            names[f"{hf}.linear_attn.conv1d.weight"] = at("linear_attn", "conv_weight")
            names[f"{hf}.linear_attn.dt_bias"] = at("linear_attn", "dt_bias")
            names[f"{hf}.linear_attn.A_log"] = at("linear_attn", "A_log")
            names[f"{hf}.linear_attn.norm.weight"] = at("linear_attn", "norm_weight")
        else:
            for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
                names[f"{hf}.self_attn.{proj}.weight"] = at("attn", proj, "kernel", transposed=True)
            for norm in ("q_norm", "k_norm"):
                names[f"{hf}.self_attn.{norm}.weight"] = at("attn", norm, "weight", offset=1.0)
    if not config.tie_embeddings:
        names[head] = Slot(("lm_head", "kernel"), None, True)
    return names


def layered_parameter_map(config: TransformerConfig, prefix: str = "model.", head: str = "lm_head.weight"
                          ) -> dict[str, Slot]:
    """Gemma 4's keys -> their Slots: layer i is a row of its stack (rl_models.gemma4.layer_rows);
    a layer that reuses another's keys and values has no k_proj, v_proj or k_norm, a full-attention
    layer with keys as values no v_proj; the per-layer inputs' embedding, projection and norm, each
    block's gate, projection and norm of its per-layer input, and its layer_scalar. Norms scale by w."""
    names: dict[str, Slot] = {f"{prefix}embed_tokens.weight": Slot(("embed",), None, False),
                              f"{prefix}norm.weight": Slot(("final_norm", "weight"), None, False)}
    if config.per_layer_input_size:
        names |= {f"{prefix}embed_tokens_per_layer.weight": Slot(("per_layer_embed",), None, False),
                  f"{prefix}per_layer_model_projection.weight": Slot(("per_layer_projection", "kernel"), None, True),
                  f"{prefix}per_layer_projection_norm.weight": Slot(("per_layer_norm", "weight"), None, False)}
    sources, windowed = config.kv_source(), config.windowed()
    norms = {"input_layernorm": "attn_norm", "post_attention_layernorm": "attn_post_norm",
             "pre_feedforward_layernorm": "mlp_norm", "post_feedforward_layernorm": "mlp_post_norm"}
    for i, (stack, row) in enumerate(layer_rows(config)):
        hf = f"{prefix}layers.{i}"

        def at(*path: str, transposed: bool = False, row: int = row, stack: str = stack) -> Slot:
            return Slot((stack, *path), row, transposed)

        for name, ours in norms.items():
            names[f"{hf}.{name}.weight"] = at(ours, "weight")
        projections = ["q_proj", "o_proj"]
        if sources[i] == i:
            projections += ["k_proj"] if config.keys_as_values and not windowed[i] else ["k_proj", "v_proj"]
        for proj in projections:
            names[f"{hf}.self_attn.{proj}.weight"] = at("attn", proj, "kernel", transposed=True)
        if config.qk_norm:
            for norm in ("q_norm", "k_norm") if sources[i] == i else ("q_norm",):
                names[f"{hf}.self_attn.{norm}.weight"] = at("attn", norm, "weight")
        for proj in ("gate_proj", "up_proj", "down_proj"):
            names[f"{hf}.mlp.{proj}.weight"] = at("mlp", proj, "kernel", transposed=True)
        if config.per_layer_input_size:
            names[f"{hf}.per_layer_input_gate.weight"] = at("per_layer_gate", "kernel", transposed=True)
            names[f"{hf}.per_layer_projection.weight"] = at("per_layer_proj", "kernel", transposed=True)
            names[f"{hf}.post_per_layer_input_norm.weight"] = at("per_layer_norm", "weight")
        if config.layer_scalars:
            names[f"{hf}.layer_scalar"] = at("layer_scalar")
    if not config.tie_embeddings:
        names[head] = Slot(("lm_head", "kernel"), None, True)
    return names
