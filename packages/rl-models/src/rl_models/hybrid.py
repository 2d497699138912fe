"""A hybrid decoder (Qwen3.5): linear-attention layers (rl_models.gated_deltanet) and
full-attention layers (rl_models.gated_attention) in the order `config.layer_types` gives,
each followed by the SwiGLU MLP, or with experts (Qwen3.5-MoE) by rl_models.moe's MoE and its
shared expert, pre-norm residual like rl_models.block's Block. With experts, `routed` returns every
layer's routing in model order and takes a replay, as the transformer's does.

Parameters: the linear-attention blocks stacked in `linear_layers`, the attention blocks in
`layers` (each on a leading layer axis, so LoRA, quantization and the sharding rules treat
them like the transformer's). The blocks run in model order: unrolled, or (`scans_layers`: on
accelerators) as one `lax.scan` over the repeating group of layers when `layer_types` repeats one
(Qwen3.5's three linear-attention layers and one attention layer).

The cache is (kv, linear): kv the transformer's stacked (k, v) [n_attention, B, K, S, Dh]
for the attention layers; linear = (conv [n_linear, B, K - 1, C], state [n_linear, B, Hv,
Dk, Dv] float32), the fixed-size state of each linear-attention layer after the last token
written, whatever the sequence's length.

The attention mask is the whole truth here too: a token is real when it may attend to its
own slot, and continues the sequence of the token in the slot before it when it may attend
to that one; otherwise its linear-attention layers start from a zero state (left padding,
packed rows, the first token of a prompt). So every caller's masks (sampler, scoring passes
with shared prompts, packing) mean the same for both kinds of layer.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import PartitionSpec

from rl_models.block import ROWS, Attention, compute_dtype, feed_forward, param_dtype, stack_layers
from rl_models.config import TransformerConfig
from rl_models.gated_attention import GatedAttention
from rl_models.gated_deltanet import GatedDeltaNet
from rl_models.gemma4 import Gemma4Transformer
from rl_models.layers import Linear, RMSNorm
from rl_models.moe import MoE, Routing
from rl_models.rope import rope_cos_sin, rope_inv_freq
from rl_models.sharding import constrain
from rl_models.transformer import Transformer, check_call, remat_policy, scans_layers, token_embedding

HybridCache = tuple[tuple[jax.Array, jax.Array], tuple[jax.Array, jax.Array]]


def _mlp(block: nnx.Module, x: jax.Array, replay: jax.Array | None) -> tuple[jax.Array, Routing | None]:
    """x + mlp(norm(x)) and, with experts, their routing (`replay` [B, L, k] forces it)."""
    if isinstance(block.mlp, MoE):
        h, routing = block.mlp.routed(block.mlp_norm(x), replay)
    else:
        h, routing = block.mlp(block.mlp_norm(x)), None
    return constrain(x + h, ROWS), routing


class LinearBlock(nnx.Module):
    """x + linear_attn(norm(x)); x + mlp(norm(x)) (the MoE with experts)."""

    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
        pdt = param_dtype(config)
        self.attn_norm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps, param_dtype=pdt)
        self.linear_attn = GatedDeltaNet(config, dtype=compute_dtype(config), param_dtype=pdt, rngs=rngs)
        self.mlp_norm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps, param_dtype=pdt)
        self.mlp = feed_forward(config, rngs=rngs)

    def __call__(self, x, valid, reset, state, replay=None):
        h, state = self.linear_attn(self.attn_norm(x), valid, reset, state)
        x, routing = _mlp(self, constrain(x + h, ROWS), replay)
        return x, state, routing


class AttentionBlock(nnx.Module):
    """x + attn(norm(x)); x + mlp(norm(x)), the attention gated when the config says so."""

    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
        pdt = param_dtype(config)
        self.attn_norm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps, param_dtype=pdt)
        self.attn = GatedAttention(config, rngs=rngs) if config.attention_output_gate else Attention(config, rngs=rngs)
        self.mlp_norm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps, param_dtype=pdt)
        self.mlp = feed_forward(config, rngs=rngs)

    def __call__(self, x, rope, mask, kv, cache_index, layer, replay=None):
        h, kv = self.attn(self.attn_norm(x), rope, mask, kv, cache_index, layer)
        x, routing = _mlp(self, constrain(x + h, ROWS), replay)
        return x, kv, routing


def sequence_flags(mask: jax.Array, cache_index: jax.Array | int) -> tuple[jax.Array, jax.Array]:
    """(valid, reset) [B, L] from the attention mask [B, L, S] of tokens written at slots
    cache_index..: valid where a token may attend to its own slot; reset where it may not
    attend to the slot before (or has none)."""
    b, length, s = mask.shape
    slot = jnp.asarray(cache_index, jnp.int32) + jnp.arange(length, dtype=jnp.int32)
    own = jnp.take_along_axis(mask, jnp.broadcast_to(slot[None, :, None], (b, length, 1)), axis=2)[..., 0]
    before = jnp.take_along_axis(mask, jnp.broadcast_to(jnp.maximum(slot - 1, 0)[None, :, None], (b, length, 1)),
                                 axis=2)[..., 0]
    return own, ~(before & (slot > 0)[None, :])


class HybridTransformer(Transformer):
    """A Transformer whose layers are of two kinds (`config.layer_types`); the same Policy
    (call, cache, logits) with the cache described in the module docstring."""

    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):  # noqa: D107 - not Transformer's layers
        if not config.hybrid:
            raise ValueError("HybridTransformer needs layer_types with 'linear_attention' layers")
        dtypes = {"dtype": compute_dtype(config), "param_dtype": param_dtype(config)}
        self.config = config
        self.embed = token_embedding(config, rngs)
        kinds = config.kinds()
        blocks = [LinearBlock(config, rngs=rngs) if k == "linear_attention" else AttentionBlock(config, rngs=rngs)
                  for k in kinds]
        self.linear_layers = stack_layers([b for b in blocks if isinstance(b, LinearBlock)])
        attention = [b for b in blocks if isinstance(b, AttentionBlock)]
        self.layers = stack_layers(attention) if attention else nnx.data(None)
        self.final_norm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps, param_dtype=dtypes["param_dtype"])
        self.lm_head = None if config.tie_embeddings else Linear(
            config.hidden_size, config.vocab_size, axes=("embed", "vocab"), use_bias=False, **dtypes, rngs=rngs)

    def _counts(self) -> tuple[int, int]:
        kinds = self.config.kinds()
        n_linear = sum(k == "linear_attention" for k in kinds)
        return n_linear, len(kinds) - n_linear

    def init_cache(self, batch_size: int, max_len: int) -> HybridCache:
        """Zeroed caches: (k, v) [n_attention, batch_size, K, max_len, Dh] in the compute dtype,
        and each linear-attention layer's (conv, state) for batch_size rows."""
        cfg = self.config
        n_linear, n_full = self._counts()
        dtype = compute_dtype(cfg)
        shape = (n_full, batch_size, cfg.num_kv_heads, max_len, cfg.head_dim)
        la = cfg.linear_attention
        assert la is not None
        channels = 2 * la.num_key_heads * la.key_head_dim + la.num_value_heads * la.value_head_dim
        conv = jnp.zeros((n_linear, batch_size, la.conv_kernel_size - 1, channels), dtype)
        state = jnp.zeros((n_linear, batch_size, la.num_value_heads, la.key_head_dim, la.value_head_dim), jnp.float32)
        return (jnp.zeros(shape, dtype), jnp.zeros(shape, dtype)), (conv, state)

    def cache_axes(self) -> Any:
        names = PartitionSpec("layers", "batch", "kv_heads", "cache_slots", "head_dim")
        return (names, names), (PartitionSpec("layers", "batch", None, None),
                                PartitionSpec("layers", "batch", None, None, None))

    def recurrent_state_bytes(self, batch_size: int) -> int:
        """Bytes of the linear-attention layers' state for `batch_size` sequences (any length)."""
        conv, state = jax.eval_shape(lambda: self.init_cache(batch_size, 1)[1])  # shapes only, nothing allocated
        return conv.size * conv.dtype.itemsize + state.size * state.dtype.itemsize

    def __call__(self, tokens: jax.Array, positions: jax.Array, attention_mask: jax.Array,
                 cache: HybridCache | None = None, cache_index: jax.Array | int = 0, *,
                 outputs_from: int = 0, replay: jax.Array | None = None) -> tuple[jax.Array, HybridCache | None]:
        hidden, cache, _ = self.routed(tokens, positions, attention_mask, cache, cache_index, outputs_from=outputs_from,
                                       replay=replay)
        return hidden, cache

    def routed(self, tokens: jax.Array, positions: jax.Array, attention_mask: jax.Array,
               cache: HybridCache | None = None, cache_index: jax.Array | int = 0, *, outputs_from: int = 0,
               replay: jax.Array | None = None) -> tuple[jax.Array, HybridCache | None, Routing | None]:
        """`__call__` and, with experts (Qwen3.5-MoE), every layer's routing in model order
        (Transformer.routed's contract: each field [layers, B, L - outputs_from, ...]; `replay`
        [layers, B, L, k] forces it); None without experts."""
        b, l = tokens.shape
        check_call(tokens, positions, attention_mask, None if cache is None else cache[0][0].shape[3], cache_index,
                   outputs_from)
        cfg = self.config
        if replay is not None:
            want = (cfg.num_layers, b, l, cfg.experts_per_token)
            if not cfg.num_experts or replay.shape != want:
                raise ValueError(f"replay of shape {replay.shape}: the model needs {want} chosen experts"
                                 if cfg.num_experts else "replay: the model has no experts to replay")
        x = constrain(jnp.take(self.embed[...], tokens, axis=0).astype(compute_dtype(cfg)), ROWS)
        rope = rope_cos_sin(positions, rope_inv_freq(cfg.rotary_dim, cfg.rope_theta, cfg.rope_scaling))
        valid, reset = sequence_flags(attention_mask, cache_index if cache is not None else 0)
        x, cache, routing = self._run_hybrid(x, rope, attention_mask, valid, reset, cache, cache_index, replay)
        return self.final_norm(x[:, outputs_from:]), cache, jax.tree.map(lambda a: a[:, :, outputs_from:], routing)

    def _run_hybrid(self, x, rope, mask, valid, reset, cache, cache_index, replay=None):
        """Every block in model order, each reading its slice of its stack; (x, cache, routing
        stacked over the layers in model order, None without experts)."""
        linear_def, linear_stack = nnx.split(self.linear_layers)
        attn_def, attn_stack = nnx.split(self.layers) if self.layers is not None else (None, None)
        wrap: Callable[[Callable], Callable] = (
            (lambda f: jax.checkpoint(f, prevent_cse=False, policy=remat_policy(self.config.remat)))
            if self.config.remat != "none" else (lambda f: f))

        @wrap
        def linear(x, params, recurrent, replay):
            return nnx.merge(linear_def, params)(x, valid, reset, recurrent, replay)

        @wrap
        def attention(x, kv, params, layer, replay):
            return nnx.merge(attn_def, params)(x, rope, mask, kv, cache_index, layer, replay)

        kv = None if cache is None else cache[0]
        period = repeating_group(self.config.kinds())
        if scans_layers(self.config) and period is not None:
            return self._scan_groups(x, linear, attention, linear_stack, attn_stack, kv, cache, period, replay)
        convs, states, routings = [], [], []
        i_linear = i_attn = 0
        for i, kind in enumerate(self.config.kinds()):
            replay_i = None if replay is None else replay[i]
            if kind == "linear_attention":
                params = jax.tree.map(lambda a, i=i_linear: a[i], linear_stack)
                recurrent = None if cache is None else (cache[1][0][i_linear], cache[1][1][i_linear])
                x, (conv, state), routing = linear(x, params, recurrent, replay_i)
                convs.append(conv)
                states.append(state)
                i_linear += 1
            else:
                params = jax.tree.map(lambda a, i=i_attn: a[i], attn_stack)
                x, kv, routing = attention(x, kv, params, jnp.int32(i_attn), replay_i)
                i_attn += 1
            routings.append(routing)
        routing = jax.tree.map(lambda *a: jnp.stack(a), *routings)
        if cache is None:
            return x, None, routing
        return x, (kv, (jnp.stack(convs).astype(cache[1][0].dtype), jnp.stack(states))), routing

    def _scan_groups(self, x, linear, attention, linear_stack, attn_stack, kv, cache, period, replay):
        """The blocks as one `lax.scan` over the repeating group (period - 1 linear-attention blocks,
        then an attention block; Qwen3.5: 3 + 1), so a program's size does not grow with depth."""
        groups, r = self.config.num_layers // period, period - 1
        grouped = jax.tree.map(lambda a: a.reshape(groups, r, *a.shape[1:]), linear_stack)
        recurrent = None if cache is None else jax.tree.map(lambda a: a.reshape(groups, r, *a.shape[1:]), cache[1])
        replays = None if replay is None else replay.reshape(groups, period, *replay.shape[1:])

        def body(carry, xs):
            x, kv = carry
            lin_params, attn_params, group_state, g, group_replay = xs
            convs, states, routings = [], [], []
            for j in range(r + 1):
                replay_j = None if group_replay is None else group_replay[j]
                if j == r:
                    x, kv, routing = attention(x, kv, attn_params, g, replay_j)
                else:
                    state = None if group_state is None else (group_state[0][j], group_state[1][j])
                    x, (conv, st), routing = linear(x, jax.tree.map(lambda a, j=j: a[j], lin_params), state, replay_j)
                    convs.append(conv)
                    states.append(st)
                routings.append(routing)
            return (x, kv), (jnp.stack(convs), jnp.stack(states), jax.tree.map(lambda *a: jnp.stack(a), *routings))

        xs = (grouped, attn_stack, recurrent, jnp.arange(groups, dtype=jnp.int32), replays)
        (x, kv), (convs, states, routing) = jax.lax.scan(body, (x, kv), xs)
        routing = jax.tree.map(lambda a: a.reshape(-1, *a.shape[2:]), routing)  # [groups, period, ...] -> model order
        if cache is None:
            return x, None, routing
        flat = (convs.reshape(-1, *convs.shape[2:]).astype(cache[1][0].dtype), states.reshape(-1, *states.shape[2:]))
        return x, (kv, flat), routing

    def loop_view(self) -> Callable[[], HybridTransformer]:
        """The model itself: its blocks already read their slices where they are."""
        return lambda: self


def repeating_group(kinds: tuple[str, ...]) -> int | None:
    """The period p when `kinds` repeats a group of p - 1 linear-attention layers then one attention
    layer (Qwen3.5: 4), else None."""
    if "full_attention" not in kinds:
        return None
    period = kinds.index("full_attention") + 1
    if period < 2 or len(kinds) % period or kinds != kinds[:period] * (len(kinds) // period):
        return None
    return period


def model_class(config: TransformerConfig) -> type[Transformer]:
    """The module that computes `config`: a HybridTransformer when some layers are linear attention,
    a Gemma4Transformer when layers differ in shape or share keys and values (`config.layered`)."""
    if config.layered:
        return Gemma4Transformer
    return HybridTransformer if config.hybrid else Transformer
