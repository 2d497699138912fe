"""Transformer hyper-parameters: a frozen, validated, keyword-only dataclass.

Presets for tests and built-in tasks are classmethods (`TransformerConfig.tiny`,
`TransformerConfig.tiny_qwen2`) and can be looked up by name with `preset`.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Callable, Literal

from rl_models.rope_types import CALL_LENGTH_ROPES, FREQUENCY_ROPES, FrequencyRope

DTYPES = ("float32", "bfloat16")
ATTENTION = ("auto", "xla", "cudnn", "splash")
REMAT = ("none", "full", "dots_saveable", "dots_with_no_batch_dims_saveable", "offload")
LAYER_TYPES = ("full_attention", "sliding_attention", "linear_attention")
ACTIVATIONS = ("silu", "gelu_tanh")
ROUTERS = ("softmax_topk", "topk_softmax")
RUNTIME_FIELDS = ("dtype", "param_dtype", "remat", "attention", "scan_layers")
"""TransformerConfig fields that say how a model runs (precision, memory, kernels, loops), not
what it is: a Hugging Face config.json does not hold them; loaders take them as overrides."""


def _require(ok: bool, cls: str, field: str, value: object, rule: str) -> None:
    if not ok:
        raise ValueError(f"{cls}.{field}={value!r}: {rule}")


@dataclass(frozen=True, kw_only=True)
class RopeScaling:
    """Llama 3.1 style ("llama3") rotary frequency scaling.

    Wavelengths longer than original_max_position_embeddings / low_freq_factor
    are divided by `factor`; shorter than .../high_freq_factor are kept; the
    band in between is interpolated smoothly.
    """

    factor: float
    """Divisor applied to low frequencies (e.g. 8.0 for Llama 3.1, 32.0 for 3.2)."""
    low_freq_factor: float
    """Wavelength threshold divisor below which frequencies are fully scaled."""
    high_freq_factor: float
    """Wavelength threshold divisor above which frequencies are kept."""
    original_max_position_embeddings: int
    """Context length the model was pre-trained with (8192 for Llama 3)."""

    def __post_init__(self) -> None:
        name = type(self).__name__
        _require(self.factor > 0, name, "factor", self.factor, "must be > 0")
        _require(
            self.low_freq_factor > 0, name, "low_freq_factor", self.low_freq_factor, "must be > 0"
        )
        _require(
            self.high_freq_factor > self.low_freq_factor,
            name,
            "high_freq_factor",
            self.high_freq_factor,
            f"must be > low_freq_factor ({self.low_freq_factor})",
        )
        _require(
            self.original_max_position_embeddings > 0,
            name,
            "original_max_position_embeddings",
            self.original_max_position_embeddings,
            "must be > 0",
        )


@dataclass(frozen=True, kw_only=True)
class LinearAttention:
    """The Gated DeltaNet layers of a hybrid model (Qwen3.5: rl_models.gated_deltanet)."""

    num_key_heads: int
    """Query/key heads Hk of the linear-attention layers."""
    num_value_heads: int
    """Value heads Hv (a multiple of num_key_heads: each key head serves Hv / Hk of them)."""
    key_head_dim: int
    """Per-head width Dk of queries and keys."""
    value_head_dim: int
    """Per-head width Dv of values (and of the recurrent state's columns)."""
    conv_kernel_size: int = 4
    """Taps of the causal depthwise convolution over q, k and v."""
    chunk_tokens: int = 64
    """Tokens per chunk of the chunked (training, prefill) form; decoding runs the recurrence."""

    def __post_init__(self) -> None:
        name = type(self).__name__
        for field in ("num_key_heads", "num_value_heads", "key_head_dim", "value_head_dim",
                      "conv_kernel_size", "chunk_tokens"):
            value = getattr(self, field)
            _require(isinstance(value, int) and not isinstance(value, bool) and value > 0,
                     name, field, value, "must be a positive int")
        _require(self.num_value_heads % self.num_key_heads == 0, name, "num_value_heads",
                 self.num_value_heads, f"must be a multiple of num_key_heads ({self.num_key_heads})")


@dataclass(frozen=True, kw_only=True)
class TransformerConfig:
    """A decoder-only transformer: the Llama block, with the per-layer and per-family settings below
    (Qwen2 biases, Qwen3 q/k norm, Mistral windows, SmolLM3 NoPE layers, Gemma 3's norms and scales,
    OLMo 2's norms after the sub-layers and q/k norms over all heads)."""

    vocab_size: int
    """Number of token ids V."""
    hidden_size: int
    """Model width D."""
    num_layers: int
    """Number of transformer blocks."""
    num_heads: int
    """Query heads H."""
    num_kv_heads: int
    """Key/value heads K (grouped-query attention); must divide num_heads."""
    mlp_hidden_size: int
    """Inner width of the SwiGLU MLP."""
    head_dim: int | None = None
    """Per-head width; None means hidden_size // num_heads, filled in at construction
    (so `dataclasses.replace(cfg, hidden_size=...)` keeps the old head_dim unless
    head_dim=None is passed too)."""
    rope_theta: float = 10000.0
    """Rotary base frequency."""
    rms_norm_eps: float = 1e-6
    """Epsilon inside every RMSNorm."""
    tie_embeddings: bool = False
    """Unembed with the (transposed) token embedding instead of a separate matrix."""
    attention_bias: bool = False
    """Biases on the q/k/v projections (Qwen2; with `attention_out_bias` too, Llama's, Qwen3's,
    SmolLM3's and Gemma 3's `attention_bias`)."""
    qk_norm: bool = False
    """RMSNorm over head_dim on queries and keys before rotary (Qwen3)."""
    qk_norm_all_heads: bool = False
    """With qk_norm, one RMSNorm over all heads' queries (H * Dh) and one over all keys (K * Dh)
    instead of one over each head's Dh (OLMo 2)."""
    rope_scaling: RopeScaling | FrequencyRope | None = None
    """Rotary frequency scaling of the (global) rope: Llama 3.1's, linear, YaRN, dynamic NTK or
    LongRoPE (these two from each call's longest position), or None."""
    sliding_window: int | None = None
    """A windowed layer's query sees the W key slots up to and including its own (Mistral,
    Gemma 3); None: no layer is windowed."""
    layer_types: tuple[str, ...] | None = None
    """Per layer, "full_attention", "sliding_attention" or "linear_attention"; None: every layer is
    windowed when `sliding_window` is set, else none (Mistral's layout). A hybrid model (with
    "linear_attention" layers) is an rl_models.hybrid.HybridTransformer."""
    rope_local_theta: float | None = None
    """Rotary base of the windowed layers, unscaled (Gemma 3's rope_local_base_freq); None: they
    share the global rope."""
    nope_layers: tuple[int, ...] = ()
    """Layers whose attention has no rotary positions (SmolLM3's NoPE layers)."""
    hidden_act: Literal["silu", "gelu_tanh"] = "silu"
    """The gated MLP's activation: SwiGLU ("silu") or GeGLU with tanh GELU ("gelu_tanh", Gemma)."""
    norm_plus_one: bool = False
    """RMSNorms scale by (1 + w) computed in float32, weights starting at 0 (Gemma)."""
    sandwich_norms: bool = False
    """Norms after the attention and after the MLP too, before each residual add (Gemma 2/3)."""
    post_norms: bool = False
    """Norms after the attention and after the MLP only, before each residual add, and none before
    them (OLMo 2)."""
    embed_scale: bool = False
    """Embeddings multiplied by sqrt(hidden_size), in the parameters' dtype (Gemma)."""
    query_scale: float | None = None
    """Attention score scale; None: 1 / sqrt(head_dim) (Gemma 3: query_pre_attn_scalar ** -0.5)."""
    partial_rotary_factor: float = 1.0
    """The fraction of head_dim that rotary positions turn (its first dims; Qwen3.5: 0.25)."""
    attention_output_gate: bool = False
    """Attention output times sigmoid(a per-head gate that q_proj also produces) (Qwen3.5)."""
    linear_attention: LinearAttention | None = None
    """The linear-attention layers' shape; required exactly when layer_types has any."""
    num_experts: int = 0
    """Experts E of each block's mixture-of-experts MLP (rl_models.moe); 0: a dense MLP."""
    experts_per_token: int = 0
    """Experts k each token is routed to (0 with no experts)."""
    moe_hidden_size: int | None = None
    """Inner width of each expert's gated MLP (None with no experts)."""
    router: Literal["softmax_topk", "topk_softmax"] = "softmax_topk"
    """"softmax_topk": softmax over every expert, then the top k (Qwen3-MoE); "topk_softmax":
    the top k logits, then a softmax over those k (gpt-oss)."""
    norm_topk_prob: bool = True
    """With "softmax_topk", renormalise the k chosen probabilities to sum to 1 (Qwen3-MoE's
    norm_topk_prob)."""
    shared_expert: bool = False
    """With experts, a shared expert every token goes through beside its k routed ones: a gated
    MLP of mlp_hidden_size whose output is scaled by sigmoid(a learned gate of the token)
    (Qwen3.5-MoE)."""
    router_bias: bool = False
    """A bias on the router's logits (gpt-oss)."""
    expert_bias: bool = False
    """Biases on each expert's gate, up and down projections (gpt-oss)."""
    swiglu_limit: float | None = None
    """The experts' clamped SwiGLU (gpt-oss): gate clamped above at the limit, up to [-limit,
    limit], out = (up + 1) * gate * sigmoid(swiglu_alpha * gate); None: silu(gate) * up."""
    swiglu_alpha: float = 1.702
    """The sigmoid's slope in the clamped SwiGLU (gpt-oss's swiglu_alpha)."""
    attention_out_bias: bool = False
    """A bias on o_proj (gpt-oss, and Llama-style `attention_bias`; Qwen2's is q/k/v only)."""
    mlp_bias: bool = False
    """Biases on the dense MLP's gate, up and down projections (Llama's and SmolLM3's `mlp_bias`)."""
    attention_sinks: bool = False
    """A learned per-head logit in every query's softmax that takes probability but no value
    (gpt-oss's attention sinks)."""
    attn_logit_softcapping: float | None = None
    """Attention scores soft-capped, cap * tanh(scores / cap), after the scale and before the mask
    (Gemma 2's attn_logit_softcapping); None: not capped."""
    final_logit_softcapping: float | None = None
    """Logits soft-capped, cap * tanh(logits / cap), wherever they are computed (Gemma 2's
    final_logit_softcapping); None: not capped."""
    global_head_dim: int | None = None
    """Head size of the full-attention layers when it differs from the windowed ones' `head_dim`
    (Gemma 4's global_head_dim); None: head_dim. Such a model is an rl_models.gemma4.Gemma4Transformer,
    as is one with any of the fields below up to `layer_scalars`."""
    global_kv_heads: int | None = None
    """KV heads of the full-attention layers (Gemma 4's num_global_key_value_heads); None: num_kv_heads."""
    keys_as_values: bool = False
    """The full-attention layers have no v_proj: their values are the key projection's output,
    before the key norm and rotary positions (Gemma 4's attention_k_eq_v)."""
    value_norm: bool = False
    """An RMSNorm without weight over each value head (Gemma 4's v_norm)."""
    kv_shared_layers: int = 0
    """The last n layers compute no keys or values: each reuses those of the last earlier layer of
    its own type (windowed or full) that computes them, and keeps no KV cache of its own (Gemma 4's
    num_kv_shared_layers)."""
    per_layer_input_size: int = 0
    """Width P of each layer's own input (Gemma 4's hidden_size_per_layer_input): a per-layer token
    embedding [V', layers * P] plus a projection of the embeddings, added to each block's output
    through a gate and a projection back to D; 0: none."""
    per_layer_vocab_size: int | None = None
    """Rows V' of the per-layer token embedding (vocab_size_per_layer_input); None: vocab_size."""
    layer_scalars: bool = False
    """Each block's output times its own learned scalar (Gemma 4's layer_scalar)."""
    wide_shared_mlp: bool = False
    """The `kv_shared_layers` layers' MLP is twice mlp_hidden_size wide (Gemma 4's use_double_wide_mlp)."""
    dtype: Literal["float32", "bfloat16"] = "float32"
    """Compute dtype: activations, matmuls and the KV cache (softmax, norms and logits run in float32)."""
    param_dtype: Literal["float32", "bfloat16"] = "float32"
    """Storage dtype of the parameters; each is cast to `dtype` where it is used. A learner
    trains float32 master weights whatever this is."""
    remat: Literal["none", "full", "dots_saveable", "dots_with_no_batch_dims_saveable", "offload"] = "none"
    """What each layer keeps for the backward pass (jax.checkpoint around each layer, with a
    `jax.checkpoint_policies` policy): "none" keeps every activation; "full" keeps only the
    layer's input and recomputes the rest; "dots_saveable" keeps every matmul's output;
    "dots_with_no_batch_dims_saveable" keeps the projections' and MLP's outputs and recomputes
    attention; "offload" keeps those in pinned host memory instead of on the device. True and
    False (the old boolean setting) mean "full" and "none"."""
    attention: Literal["auto", "xla", "cudnn", "splash"] = "auto"
    """Attention for training and prefill (rl_models.attention): "xla" (batched matmuls over
    (batch, KV head) with a float32 softmax) runs everywhere; "cudnn" is
    `jax.nn.dot_product_attention`'s fused flash-attention kernel (NVIDIA GPUs, bfloat16 compute);
    "splash" is JAX's Splash kernel (TPU); "auto" picks when a program is traced: cudnn on a GPU
    when the dtype and head size allow it, splash on TPU for 128 queries or more, xla elsewhere (so on
    CPU it is xla)."""
    scan_layers: bool | None = None
    """Run the blocks as one `lax.scan` (True: a program's size and compile time do not grow
    with depth) or unrolled (False: no loop; XLA:CPU runs the tiny-qwen2 update 40% faster).
    None picks by the platform a program is traced for: unrolled on CPU, scanned elsewhere.
    The parameters are stacked on a layer axis either way, so checkpoints do not depend on it."""

    def __post_init__(self) -> None:
        name = type(self).__name__
        for field in ("vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads",
                      "mlp_hidden_size"):
            value = getattr(self, field)
            _require(
                isinstance(value, int) and not isinstance(value, bool) and value > 0,
                name, field, value, "must be a positive int",
            )
        _require(
            self.num_heads % self.num_kv_heads == 0,
            name, "num_kv_heads", self.num_kv_heads,
            f"must divide num_heads ({self.num_heads})",
        )
        if self.head_dim is None:
            _require(
                self.hidden_size % self.num_heads == 0,
                name, "hidden_size", self.hidden_size,
                f"must be divisible by num_heads ({self.num_heads}) when head_dim is None",
            )
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_heads)
        _require(
            isinstance(self.head_dim, int) and self.head_dim > 0 and self.head_dim % 2 == 0,
            name, "head_dim", self.head_dim, "must be a positive even int (rotary halves)",
        )
        _require(self.rope_theta > 0, name, "rope_theta", self.rope_theta, "must be > 0")
        _require(self.rms_norm_eps > 0, name, "rms_norm_eps", self.rms_norm_eps, "must be > 0")
        for field in ("dtype", "param_dtype"):
            value = getattr(self, field)
            _require(value in DTYPES, name, field, value, f"must be one of {DTYPES}")
        _require(self.attention in ATTENTION, name, "attention", self.attention,
                 f"must be one of {ATTENTION}")
        _require(
            self.attention != "cudnn" or self.dtype == "bfloat16", name, "attention", self.attention,
            "cuDNN attention needs dtype='bfloat16'",
        )
        _require(
            self.rope_scaling is None
            or isinstance(self.rope_scaling, (RopeScaling, *FREQUENCY_ROPES)),
            name, "rope_scaling", self.rope_scaling,
            "must be None, a RopeScaling, LinearRope, YarnRope, DynamicNTKRope, LongRope or ProportionalRope",
        )
        _require(0 < self.partial_rotary_factor <= 1 and int(self.head_dim * self.partial_rotary_factor) % 2 == 0,
                 name, "partial_rotary_factor", self.partial_rotary_factor,
                 f"must be in (0, 1] and turn an even number of the {self.head_dim} head dims")
        factors = getattr(self.rope_scaling, "short_factor", None)
        _require(factors is None or len(factors) == self.rotary_dim // 2, name, "rope_scaling", "LongRope",
                 f"needs {self.rotary_dim // 2} factors per list (half the {self.rotary_dim} rotary dims), has "
                 f"{len(factors or ())}")
        for field in ("attn_logit_softcapping", "final_logit_softcapping"):
            cap = getattr(self, field)
            _require(cap is None or (isinstance(cap, (int, float)) and not isinstance(cap, bool) and cap > 0),
                     name, field, cap, "must be None or a number > 0")
        self._check_layers(name)
        self._check_layered(name)
        _require((self.linear_attention is not None) == self.hybrid, name, "linear_attention",
                 self.linear_attention, "must be set exactly when layer_types has 'linear_attention' layers")
        _require(not (self.hybrid and self.sliding_window is not None), name, "sliding_window",
                 self.sliding_window, "must be None in a hybrid (linear-attention) model")
        if isinstance(self.remat, bool):  # the boolean setting of earlier versions (run folders keep it)
            object.__setattr__(self, "remat", "full" if self.remat else "none")
        _require(self.remat in REMAT, name, "remat", self.remat, f"must be one of {REMAT}")
        for field in ("tie_embeddings", "attention_bias", "qk_norm", "qk_norm_all_heads", "attention_output_gate",
                      "norm_plus_one", "sandwich_norms", "post_norms", "embed_scale"):
            value = getattr(self, field)
            _require(isinstance(value, bool), name, field, value, "must be a bool")
        _require(self.qk_norm or not self.qk_norm_all_heads, name, "qk_norm_all_heads", True, "needs qk_norm")
        _require(not (self.post_norms and self.sandwich_norms), name, "post_norms", True,
                 "and sandwich_norms exclude each other (norms after the sub-layers only, or before and after)")
        _require(not (self.post_norms or self.qk_norm_all_heads) or not self.hybrid, name, "post_norms",
                 self.post_norms, "a hybrid (linear-attention) model has pre-norms and per-head q/k norms")
        _require(self.scan_layers is None or isinstance(self.scan_layers, bool), name, "scan_layers",
                 self.scan_layers, "must be a bool or None (by platform)")

    @property
    def hybrid(self) -> bool:
        """Whether some layers are linear attention (rl_models.hybrid)."""
        return self.layer_types is not None and "linear_attention" in self.layer_types

    def kinds(self) -> tuple[str, ...]:
        """Each layer's kind (`layer_types`, every layer full attention when None)."""
        return self.layer_types or ("full_attention",) * self.num_layers

    @property
    def rotary_dim(self) -> int:
        """The head dims rotary positions turn (`partial_rotary_factor` of head_dim)."""
        return int(self.head_dim * self.partial_rotary_factor)  # type: ignore[operator]

    def _check_layers(self, name: str) -> None:
        """The per-layer settings: window, layer types, local theta, NoPE layers, activation."""
        w = self.sliding_window
        _require(w is None or (isinstance(w, int) and not isinstance(w, bool) and w > 0), name, "sliding_window",
                 w, "must be None or a positive int")
        if self.layer_types is not None:
            object.__setattr__(self, "layer_types", tuple(self.layer_types))
            types = self.layer_types
            _require(len(types) == self.num_layers, name, "layer_types", types,
                     f"must name one type per layer ({self.num_layers})")
            _require(set(types) <= set(LAYER_TYPES), name, "layer_types", types, f"each must be one of {LAYER_TYPES}")
            _require(w is not None or "sliding_attention" not in types, name, "layer_types", types,
                     "sliding_attention layers need a sliding_window")
            if set(types) == {"sliding_attention"}:  # one spelling of "every layer windowed": None
                object.__setattr__(self, "layer_types", None)
        _require(self.rope_local_theta is None or self.rope_local_theta > 0, name, "rope_local_theta",
                 self.rope_local_theta, "must be None or > 0")
        object.__setattr__(self, "nope_layers", tuple(self.nope_layers))
        _require(all(isinstance(i, int) and 0 <= i < self.num_layers for i in self.nope_layers), name,
                 "nope_layers", self.nope_layers, f"must be layer indices below {self.num_layers}")
        _require(self.hidden_act in ACTIVATIONS, name, "hidden_act", self.hidden_act, f"must be one of {ACTIVATIONS}")
        _require(self.query_scale is None or self.query_scale > 0, name, "query_scale", self.query_scale,
                 "must be None or > 0")
        self._check_experts(name)

    @property
    def layered(self) -> bool:
        """Whether layers differ in shape or share keys and values (Gemma 4's fields, from
        `global_head_dim` to `layer_scalars`): an rl_models.gemma4.Gemma4Transformer."""
        return (self.global_head_dim is not None or self.global_kv_heads is not None or self.keys_as_values
                or self.value_norm or self.kv_shared_layers > 0 or self.per_layer_input_size > 0
                or self.layer_scalars or self.wide_shared_mlp)

    def kv_source(self) -> tuple[int, ...]:
        """Per layer, the layer whose keys and values it reads: itself, or for one of the last
        `kv_shared_layers` the last earlier layer of its type that computes its own."""
        kinds, first = self.windowed(), self.num_layers - self.kv_shared_layers
        owners = {w: max(i for i in range(first) if kinds[i] == w) for w in set(kinds[:first])}
        return tuple(i if i < first else owners[kinds[i]] for i in range(self.num_layers))

    def _check_layered(self, name: str) -> None:
        """Gemma 4's fields: sizes positive, shared layers each with an earlier layer of its type."""
        for field in ("global_head_dim", "global_kv_heads", "per_layer_vocab_size"):
            value = getattr(self, field)
            _require(value is None or (isinstance(value, int) and not isinstance(value, bool) and value > 0),
                     name, field, value, "must be None or a positive int")
        _require(self.global_head_dim is None or self.global_head_dim % 2 == 0, name, "global_head_dim",
                 self.global_head_dim, "must be even (rotary halves)")
        _require(self.global_kv_heads is None or self.num_heads % self.global_kv_heads == 0, name,
                 "global_kv_heads", self.global_kv_heads, f"must divide num_heads ({self.num_heads})")
        for field in ("kv_shared_layers", "per_layer_input_size"):
            value = getattr(self, field)
            _require(isinstance(value, int) and not isinstance(value, bool) and value >= 0, name, field, value,
                     "must be an int >= 0")
        for field in ("keys_as_values", "value_norm", "layer_scalars", "wide_shared_mlp"):
            _require(isinstance(getattr(self, field), bool), name, field, getattr(self, field), "must be a bool")
        _require(self.kv_shared_layers < self.num_layers, name, "kv_shared_layers", self.kv_shared_layers,
                 f"must leave a layer that computes keys and values (of {self.num_layers})")
        kinds, first = self.windowed(), self.num_layers - self.kv_shared_layers
        _require(set(kinds[first:]) <= set(kinds[:first]), name, "kv_shared_layers", self.kv_shared_layers,
                 "each shared layer needs an earlier layer of its type (windowed or full) to share with")
        _require(not (self.layered and (self.hybrid or self.num_experts)), name, "kv_shared_layers",
                 self.kv_shared_layers, "Gemma 4's layered block has no linear-attention layers or experts")

    def layer_shape(self, i: int) -> tuple[int, int]:
        """(KV heads, head size) of layer i: a full-attention layer's own (`global_kv_heads`,
        `global_head_dim`) when set, else num_kv_heads and head_dim."""
        if self.windowed()[i]:
            return self.num_kv_heads, self.head_dim  # type: ignore[return-value]
        return self.global_kv_heads or self.num_kv_heads, self.global_head_dim or self.head_dim  # type: ignore[return-value]

    def _check_experts(self, name: str) -> None:
        """The mixture-of-experts settings: all unset (dense), or E >= k >= 1 with a width."""
        e, k, f = self.num_experts, self.experts_per_token, self.moe_hidden_size
        for field, value in (("num_experts", e), ("experts_per_token", k)):
            _require(isinstance(value, int) and not isinstance(value, bool) and value >= 0, name, field, value,
                     "must be an int >= 0")
        if e == 0:
            _require(k == 0 and f is None, name, "num_experts", e,
                     "is 0 (a dense MLP): experts_per_token must be 0 and moe_hidden_size None")
        else:
            _require(1 <= k <= e, name, "experts_per_token", k, f"must be between 1 and num_experts ({e})")
            _require(isinstance(f, int) and not isinstance(f, bool) and f > 0, name, "moe_hidden_size", f,
                     "must be a positive int when num_experts > 0")
        _require(self.router in ROUTERS, name, "router", self.router, f"must be one of {ROUTERS}")
        _require(isinstance(self.norm_topk_prob, bool), name, "norm_topk_prob", self.norm_topk_prob, "must be a bool")
        _require(self.swiglu_limit is None or self.swiglu_limit > 0, name, "swiglu_limit", self.swiglu_limit,
                 "must be None or > 0")
        for field in ("shared_expert", "router_bias", "expert_bias", "attention_out_bias", "attention_sinks", "mlp_bias"):
            _require(isinstance(getattr(self, field), bool), name, field, getattr(self, field), "must be a bool")
        if e == 0:
            for field in ("router_bias", "expert_bias"):
                _require(not getattr(self, field), name, field, True, "needs experts (num_experts > 0)")
            _require(self.swiglu_limit is None, name, "swiglu_limit", self.swiglu_limit, "needs experts")
            _require(not self.shared_expert, name, "shared_expert", True, "needs experts (num_experts > 0)")
        else:
            _require(not self.mlp_bias, name, "mlp_bias", True, "is the dense MLP's (experts have expert_bias)")

    def windowed(self) -> tuple[bool, ...]:
        """Per layer, whether its attention is windowed (see `layer_types`)."""
        if self.sliding_window is None:
            return (False,) * self.num_layers
        if self.layer_types is None:
            return (True,) * self.num_layers
        return tuple(t == "sliding_attention" for t in self.layer_types)

    def tensor_parallel_problem(self, ways: int) -> str | None:
        """Why `ways`-way tensor parallelism cannot give each device whole attention heads
        (None: it can). Query heads must split evenly; KV heads split evenly too, or, when
        there are fewer of them than devices, each is replicated on `ways // K` devices."""
        h, k = self.num_heads, self.num_kv_heads
        if ways <= 1:
            return None
        if h % ways:
            fits = [n for n in range(1, h + 1) if h % n == 0 and (k % n == 0 or n % k == 0)]
            return (f"{ways} devices cannot each hold whole query heads of the model's {h}; "
                    f"tensor parallelism over {fits} devices can")
        if k % ways and ways % k:
            return (f"the model's {k} KV heads neither split evenly over {ways} devices nor replicate "
                    f"evenly on them (use a divisor or a multiple of {k})")
        return None

    def position_problem(self, positions: int) -> str | None:
        """Why sequences of `positions` tokens would not be computed as the model's folder says
        (dynamic NTK rope or LongRoPE past its limit); None when they are."""
        if isinstance(self.rope_scaling, CALL_LENGTH_ROPES):
            return self.rope_scaling.position_problem(positions)
        return None

    def runtime(self) -> dict[str, object]:
        """The fields that say how the model runs, not what it computes (see RUNTIME_FIELDS)."""
        return {field: getattr(self, field) for field in RUNTIME_FIELDS}

    @classmethod
    def tiny(cls, vocab_size: int, **overrides: object) -> TransformerConfig:
        """A very small model for unit tests: D=64, 2 layers, 4 heads, 2 KV heads."""
        fields: dict[str, object] = dict(
            vocab_size=vocab_size, hidden_size=64, num_layers=2, num_heads=4,
            num_kv_heads=2, mlp_hidden_size=128,
        )
        return cls(**(fields | overrides))  # type: ignore[arg-type]

    @classmethod
    def tiny_qwen2(cls, vocab_size: int, **overrides: object) -> TransformerConfig:
        """A small Qwen2-shaped model for built-in tasks: D=128, 4 layers, 4/2 heads, tied."""
        fields: dict[str, object] = dict(
            vocab_size=vocab_size, hidden_size=128, num_layers=4, num_heads=4,
            num_kv_heads=2, mlp_hidden_size=512, tie_embeddings=True,
            attention_bias=True,
        )
        return cls(**(fields | overrides))  # type: ignore[arg-type]


def _qwen2_shape(hidden: int, layers: int, heads: int, mlp: int) -> Callable[..., TransformerConfig]:
    """A Qwen2.5-shaped model (2 KV heads, q/k/v biases, tied embeddings, rope 1e6) for any vocabulary."""

    def make(vocab_size: int, **overrides: object) -> TransformerConfig:
        fields: dict[str, object] = dict(
            vocab_size=vocab_size, hidden_size=hidden, num_layers=layers, num_heads=heads, num_kv_heads=2,
            mlp_hidden_size=mlp, tie_embeddings=True, attention_bias=True, rope_theta=1e6,
        )
        return TransformerConfig(**(fields | overrides))  # type: ignore[arg-type]

    return make


PRESETS: dict[str, Callable[..., TransformerConfig]] = {
    "tiny": TransformerConfig.tiny,
    "tiny_qwen2": TransformerConfig.tiny_qwen2,
    # the shapes of Qwen2.5-0.5B / 1.5B blocks, for benchmarks and `trainer plan` on accelerators
    "qwen2_0_5b_shape": _qwen2_shape(896, 24, 14, 4864),
    "qwen2_1_5b_shape": _qwen2_shape(1536, 28, 12, 8960),
}


def preset(name: str, *, vocab_size: int, **overrides: object) -> TransformerConfig:
    """The named preset config for `vocab_size`; unknown names list the known ones."""
    if name not in PRESETS:
        close = difflib.get_close_matches(name, PRESETS, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ValueError(
            f"unknown model preset {name!r}; known presets: {sorted(PRESETS)}.{hint}"
        )
    return PRESETS[name](vocab_size, **overrides)
