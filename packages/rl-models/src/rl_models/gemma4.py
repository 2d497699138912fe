"""Gemma 4's text decoder: layers that differ in shape and share keys and values
(`TransformerConfig.layered`).

What it adds to Gemma 3's block (GeGLU, norms before and after each sub-layer, scaled embeddings):
  - full-attention layers with their own head size and KV heads (`global_head_dim`,
    `global_kv_heads`), their values the key projection's output (`keys_as_values`), and a
    proportional rope (rl_models.rope_types.ProportionalRope); windowed layers the default rope at
    `rope_local_theta`;
  - q and k norms, an unscaled norm over each value head (`value_norm`), attention scale 1
    (`query_scale`);
  - the last `kv_shared_layers` layers compute no keys or values: each reads those of the last
    earlier layer of its type (`TransformerConfig.kv_source`), so only the layers that compute them
    have a KV cache;
  - per-layer inputs (`per_layer_input_size` P): a per-layer token embedding plus a normed projection
    of the embeddings, [B, L, layers, P], fed into each block after its MLP through a gate;
  - each block's output times its learned `layer_scalar`;
  - with `wide_shared_mlp`, the sharing layers' MLP of twice the width.

Parameters: blocks of one shape are stacked together (`stack_of`: "layers" the windowed layers that
compute keys and values, "global_layers" the full-attention ones, "shared_layers" and
"global_shared_layers" those that reuse them), so LoRA, quantization and the sharding rules treat
them like the transformer's. The blocks run unrolled in model order, each reading its row.

The cache is (ks, vs), one [B, K_i, S, Dh_i] buffer per layer that computes keys and values, in
model order (`cache_layers`); a sharing layer reads its source's buffer after the source wrote the
call's keys and values into it. As everywhere, the attention mask [B, L, S] is the whole truth.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import PartitionSpec

from rl_models import attention as attention_lib
from rl_models.attention import attend, attend_sequence
from rl_models.block import ACTIVATION_FUNCTIONS, MLP, ROWS, compute_dtype, norm, param_dtype, stack_layers, within_window
from rl_models.config import TransformerConfig
from rl_models.layers import Linear, RMSNorm, param
from rl_models.moe import Routing
from rl_models.rope import rope_cos_sin, rope_frequencies, rotate
from rl_models.rope_types import default_inv_freq
from rl_models.sharding import constrain
from rl_models.transformer import EMBED_INIT, Transformer, check_call, embed_tokens, remat_policy, token_embedding

LayeredCache = tuple[tuple[jax.Array, ...], tuple[jax.Array, ...]]
STACKS = ("layers", "global_layers", "shared_layers", "global_shared_layers")
"""The parameter stacks, by (full attention, shares keys and values)."""


def stack_of(config: TransformerConfig, i: int) -> str:
    """The stack holding layer i's parameters (see the module doc)."""
    full = not config.windowed()[i]
    shared = config.kv_source()[i] != i
    return STACKS[2 * shared + full]


def layer_rows(config: TransformerConfig) -> tuple[tuple[str, int], ...]:
    """Per layer, (its stack, its row there)."""
    counts: dict[str, int] = {}
    rows = []
    for i in range(config.num_layers):
        stack = stack_of(config, i)
        rows.append((stack, counts.get(stack, 0)))
        counts[stack] = counts.get(stack, 0) + 1
    return tuple(rows)


def cache_layers(config: TransformerConfig) -> tuple[int, ...]:
    """The layers that compute keys and values (and have a cache), in model order."""
    return tuple(i for i, src in enumerate(config.kv_source()) if src == i)


def value_normed(v: jax.Array, eps: float) -> jax.Array:
    """v [..., Dh] over its root mean square in float32, no weight (Gemma 4's v_norm)."""
    v32 = v.astype(jnp.float32)
    return (v32 * jax.lax.rsqrt(jnp.mean(v32 * v32, axis=-1, keepdims=True) + eps)).astype(v.dtype)


class LayeredAttention(nnx.Module):
    """Grouped-query attention of one layer of its own shape; without `owns_kv` it has only q_proj,
    q_norm and o_proj, and attends over another layer's keys and values."""

    def __init__(self, config: TransformerConfig, i: int, *, rngs: nnx.Rngs):
        dtypes = {"dtype": compute_dtype(config), "param_dtype": param_dtype(config)}
        kv, dh = config.layer_shape(i)
        d, h = config.hidden_size, config.num_heads
        full = not config.windowed()[i]
        heads = {"use_bias": False, "units": (1, dh), **dtypes, "rngs": rngs}
        self.q_proj = Linear(d, h * dh, axes=("embed", "heads"), **heads)
        self.o_proj = Linear(h * dh, d, axes=("heads", "embed"), use_bias=False, units=(dh, 1), **dtypes, rngs=rngs)
        normed = {"eps": config.rms_norm_eps, "param_dtype": param_dtype(config), "axis": "head_dim",
                  "plus_one": config.norm_plus_one}
        self.q_norm = RMSNorm(dh, **normed) if config.qk_norm else None
        owns = config.kv_source()[i] == i
        self.k_proj = Linear(d, kv * dh, axes=("embed", "kv_heads"), **heads) if owns else None
        self.v_proj = (Linear(d, kv * dh, axes=("embed", "kv_heads"), **heads)
                       if owns and not (full and config.keys_as_values) else None)
        self.k_norm = RMSNorm(dh, **normed) if owns and config.qk_norm else None
        self.config = config

    def keys_values(self, x: jax.Array, rope: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, jax.Array]:
        """This layer's keys (normed, rotated) and values [B, L, K, Dh] of x [B, L, D]."""
        assert self.k_proj is not None
        b, l, _ = x.shape
        dh = self.q_proj.kernel.shape[-1] // self.config.num_heads
        k = self.k_proj(x).reshape(b, l, -1, dh)
        v = k if self.v_proj is None else self.v_proj(x).reshape(b, l, -1, dh)
        if self.k_norm is not None:
            k = self.k_norm(k)
        if self.config.value_norm:
            v = value_normed(v, self.config.rms_norm_eps)
        k = rotate(k, *rope)
        return (constrain(k, ("act_batch", "act_length", "act_kv_heads", None)),
                constrain(v, ("act_batch", "act_length", "act_kv_heads", None)))

    def __call__(self, x: jax.Array, rope: tuple[jax.Array, jax.Array], mask: jax.Array,
                 kv: tuple[jax.Array, jax.Array], window: int | None, first_slot: jax.Array | int,
                 cached: bool) -> jax.Array:
        """The attention output [B, L, D] of x [B, L, D] over `kv`: keys and values [B, S, K, Dh]
        (`cached` False: this call's own) or a cache's [B, K, S, Dh] (`cached` True)."""
        cfg = self.config
        b, l, _ = x.shape
        dh = self.q_proj.kernel.shape[-1] // cfg.num_heads
        q = self.q_proj(x).reshape(b, l, cfg.num_heads, dh)
        q = constrain(q, ("act_batch", "act_length", "act_heads", None))
        if self.q_norm is not None:
            q = self.q_norm(q)
        q = rotate(q, *rope)
        if window is not None:
            mask = within_window(mask, window, first_slot)
        cap, scale = cfg.attn_logit_softcapping, cfg.query_scale
        kind = attention_lib.traced_kernel(cfg.attention, dtype=q.dtype, head_dim=dh,
                                           length=q.shape[1]) if l > 1 else "xla"
        if cached and (kind == "xla" or (kind == "splash" and (window is not None or not isinstance(first_slot, int)))):
            out = attend(q, kv[0], kv[1], mask, scale, None, cap)  # the cache's layout
        elif cached:  # a prefill through the fused kernel (Splash's causal blocks need a static offset)
            offset = first_slot if isinstance(first_slot, int) else 0
            out = attend_sequence(q, kv[0].transpose(0, 2, 1, 3), kv[1].transpose(0, 2, 1, 3), mask, cfg.attention,
                                  offset=offset, scale=scale, softcap=cap)
        else:
            out = attend_sequence(q, kv[0], kv[1], mask, cfg.attention, scale=scale, windowed=window is not None,
                                  softcap=cap)
        return self.o_proj(constrain(out, ("act_batch", "act_length", "act_heads")))


class LayeredBlock(nnx.Module):
    """Gemma's sandwich-normed block (rl_models.block.Block's norms), then the per-layer input
    (x + norm(proj(act(gate(x)) * per_layer_input))), then the output times `layer_scalar`."""

    def __init__(self, config: TransformerConfig, i: int, *, rngs: nnx.Rngs):
        dtypes = {"dtype": compute_dtype(config), "param_dtype": param_dtype(config)}
        self.attn_norm = norm(config)
        self.attn = LayeredAttention(config, i, rngs=rngs)
        self.attn_post_norm = norm(config)
        self.mlp_norm = norm(config)
        wide = config.wide_shared_mlp and config.kv_source()[i] != i  # a sharing layer's double-wide MLP
        self.mlp = MLP(dataclasses.replace(config, mlp_hidden_size=2 * config.mlp_hidden_size) if wide else config,
                       rngs=rngs)
        self.mlp_post_norm = norm(config)
        p, d = config.per_layer_input_size, config.hidden_size
        self.per_layer_gate = Linear(d, p, axes=("embed", None), use_bias=False, **dtypes, rngs=rngs) if p else None
        self.per_layer_proj = Linear(p, d, axes=(None, "embed"), use_bias=False, **dtypes, rngs=rngs) if p else None
        self.per_layer_norm = norm(config) if p else None
        self.layer_scalar = param(jnp.ones((1,), param_dtype(config)), (None,)) if config.layer_scalars else None
        self.act = config.hidden_act

    def __call__(self, x: jax.Array, h_attn: jax.Array, per_layer: jax.Array | None) -> jax.Array:
        """The block's output from its input x and its attention's output on attn_norm(x)."""
        x = constrain(x + self.attn_post_norm(h_attn), ROWS)
        x = constrain(x + self.mlp_post_norm(self.mlp(self.mlp_norm(x))), ROWS)
        if self.per_layer_gate is not None and per_layer is not None:
            act = ACTIVATION_FUNCTIONS[self.act](self.per_layer_gate(x))
            x = x + self.per_layer_norm(self.per_layer_proj(act * per_layer.astype(act.dtype)))
        if self.layer_scalar is not None:
            x = x * self.layer_scalar[...].astype(x.dtype)
        return constrain(x, ROWS)


class Gemma4Transformer(Transformer):
    """A Transformer whose layers differ in shape and share keys and values (the module doc); the
    same Policy (call, cache, logits), with the cache described there."""

    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):  # noqa: D107 - not Transformer's layers
        if not config.layered:
            raise ValueError("Gemma4Transformer needs a layered config (TransformerConfig.layered)")
        dtypes = {"dtype": compute_dtype(config), "param_dtype": param_dtype(config)}
        self.config = config
        self.embed = token_embedding(config, rngs)
        blocks = [LayeredBlock(config, i, rngs=rngs) for i in range(config.num_layers)]
        for stack in STACKS:
            mine = [b for i, b in enumerate(blocks) if stack_of(config, i) == stack]
            setattr(self, stack, stack_layers(mine) if mine else nnx.data(None))
        p = config.per_layer_input_size
        if p:
            rows, width = config.per_layer_vocab_size or config.vocab_size, config.num_layers * p
            # split like the token embedding (its width over fsdp): at Gemma 4's sizes it is the largest tensor
            self.per_layer_embed = param(EMBED_INIT(rngs.params(), (rows, width), dtypes["param_dtype"]),
                                         ("vocab", "embed"))
            self.per_layer_projection = Linear(config.hidden_size, width, axes=("embed", None), use_bias=False,
                                               **dtypes, rngs=rngs)
            self.per_layer_norm = RMSNorm(p, eps=config.rms_norm_eps, param_dtype=dtypes["param_dtype"],
                                          plus_one=config.norm_plus_one)
        else:
            self.per_layer_embed = self.per_layer_projection = self.per_layer_norm = nnx.data(None)
        self.final_norm = norm(config)
        self.lm_head = None if config.tie_embeddings else Linear(
            config.hidden_size, config.vocab_size, axes=("embed", "vocab"), use_bias=False, **dtypes, rngs=rngs)

    def init_cache(self, batch_size: int, max_len: int) -> LayeredCache:
        """Zeroed (ks, vs): one [batch_size, K_i, max_len, Dh_i] each per layer with a cache
        (`cache_layers`), in the compute dtype."""
        cfg, dtype = self.config, compute_dtype(self.config)
        shapes = [(batch_size, *cfg.layer_shape(i)[:1], max_len, cfg.layer_shape(i)[1]) for i in cache_layers(cfg)]
        return tuple(jnp.zeros(s, dtype) for s in shapes), tuple(jnp.zeros(s, dtype) for s in shapes)

    def cache_axes(self) -> Any:
        names = (PartitionSpec("batch", "kv_heads", "cache_slots", "head_dim"),) * len(cache_layers(self.config))
        return names, names

    def init_decode_cache(self, batch_size: int, max_len: int) -> LayeredCache:
        """`init_cache`'s (no rings: a windowed layer's keys may be read by a sharing layer)."""
        return self.init_cache(batch_size, max_len)

    def decode_cache_axes(self) -> Any:
        return self.cache_axes()

    def routed(self, tokens: jax.Array, positions: jax.Array, attention_mask: jax.Array,
               cache: LayeredCache | None = None, cache_index: jax.Array | int = 0, *, outputs_from: int = 0,
               replay: jax.Array | None = None) -> tuple[jax.Array, LayeredCache | None, Routing | None]:
        """Transformer.routed's contract (no experts: routing None, no replay)."""
        b, l = tokens.shape
        check_call(tokens, positions, attention_mask, None if cache is None else cache[0][0].shape[2], cache_index,
                   outputs_from)
        if replay is not None:
            raise ValueError("replay: the model has no experts to replay")
        x = constrain(embed_tokens(self, tokens), ROWS)
        per_layer = self._per_layer_inputs(tokens, x)
        x, cache = self._run_layers_in_order(x, self._ropes(positions), attention_mask, per_layer, cache,
                                             cache_index)
        return self.final_norm(x[:, outputs_from:]), cache, None

    def _ropes(self, positions: jax.Array) -> dict[bool, tuple[jax.Array, jax.Array]]:
        """(cos, sin) by whether a layer is windowed: the windowed layers' default rope at
        `rope_local_theta` (rope_theta without one), the full layers' (scaled) rope over their head."""
        cfg = self.config
        tables = {}
        for windowed in set(cfg.windowed()):
            i = cfg.windowed().index(windowed)
            dim = cfg.layer_shape(i)[1]
            if windowed:
                tables[windowed] = rope_cos_sin(positions, default_inv_freq(dim, cfg.rope_local_theta or cfg.rope_theta))
            else:
                tables[windowed] = rope_cos_sin(positions, *rope_frequencies(dim, cfg.rope_theta, cfg.rope_scaling))
        return tables

    def _per_layer_inputs(self, tokens: jax.Array, x: jax.Array) -> jax.Array | None:
        """[B, L, layers, P]: (norm(projection(embeddings) / sqrt(D)) + per-layer embedding * sqrt(P))
        / sqrt(2), as transformers' project_per_layer_inputs; None without per-layer inputs."""
        cfg = self.config
        p = cfg.per_layer_input_size
        if not p:
            return None
        b, l = tokens.shape
        rows = jnp.take(self.per_layer_embed[...], tokens, axis=0)
        rows = (rows * jnp.asarray(math.sqrt(p), rows.dtype)).astype(x.dtype).reshape(b, l, cfg.num_layers, p)
        projected = self.per_layer_projection(x) * jnp.asarray(cfg.hidden_size ** -0.5, x.dtype)
        projected = self.per_layer_norm(projected.reshape(b, l, cfg.num_layers, p))
        return (projected + rows) * jnp.asarray(2.0 ** -0.5, x.dtype)

    def _run_layers_in_order(self, x, ropes, mask, per_layer, cache, cache_index):
        """Every block in model order, each reading its row of its stack; a layer that computes keys
        and values writes them (into its cache buffer), a sharing layer reads its source's."""
        cfg = self.config
        windows = [cfg.sliding_window if w else None for w in cfg.windowed()]
        sources, owners = cfg.kv_source(), cache_layers(cfg)
        splits = {s: nnx.split(getattr(self, s)) for s in STACKS if getattr(self, s) is not None}
        wrap: Callable[[Callable], Callable] = (
            (lambda f: jax.checkpoint(f, prevent_cse=False, policy=remat_policy(cfg.remat)))
            if cfg.remat != "none" else (lambda f: f))
        first = 0 if cache is None else cache_index

        def run(i: int, stack: str) -> Callable:
            graphdef, state = splits[stack]

            @wrap
            def layer(x, params, kv, per_layer_i):
                block = nnx.merge(graphdef, params)
                rope = ropes[cfg.windowed()[i]]
                h = block.attn_norm(x)
                if sources[i] == i:
                    k, v = block.attn.keys_values(h, rope)
                    if kv is None:
                        kv = (k, v)
                    else:  # written at slots cache_index.., then the whole buffer read
                        start = (0, 0, jnp.asarray(cache_index, jnp.int32), 0)
                        kv = tuple(jax.lax.dynamic_update_slice(c, n.transpose(0, 2, 1, 3).astype(c.dtype), start)
                                   for c, n in zip(kv, (k, v)))
                out = block.attn(h, rope, mask, kv, windows[i], first, cache is not None)
                return block(x, out, per_layer_i), kv

            return layer, state

        kvs: dict[int, tuple[jax.Array, jax.Array]] = {}
        if cache is not None:
            kvs = {i: (cache[0][j], cache[1][j]) for j, i in enumerate(owners)}
        for i, (stack, row) in enumerate(layer_rows(cfg)):
            layer, state = run(i, stack)
            params = jax.tree.map(lambda a, row=row: a[row], state)
            per_layer_i = None if per_layer is None else per_layer[:, :, i]
            x, kv = layer(x, params, kvs.get(sources[i]), per_layer_i)
            kvs[sources[i]] = kv
        if cache is None:
            return x, None
        return x, (tuple(kvs[i][0] for i in owners), tuple(kvs[i][1] for i in owners))

    def loop_view(self) -> Callable[[], Gemma4Transformer]:
        """The model itself: its blocks already read their rows where they are."""
        return lambda: self
