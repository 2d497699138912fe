"""The transformer over a paged KV cache, and the engine's inference copy: the paged
rollout engine's adapter for `Transformer` (`PAGED_TRANSFORMER`, an
`rl_core.policy.protocols.PagedModel`), which whoever builds the engine passes next to the policy.

Shapes: N tokens (each its own query: a decode slot's next token or one token
of a prefill chunk), M pages per sequence.

The pool and its layout belong to the caller's `kv` (rl_core.rollout.attention):
per layer the model hands it each token's query, key and value, and `kv` writes
the key/value at the token's slot and returns the attention output (see
`rl_core.policy.protocols.PagedModel`). Token n sits at position `positions[n]` of the
sequence whose page table is `page_rows[n]` and attends to slots 0..pos of it.
So a prefill chunk (many tokens of one sequence) and decode slots (one token
of many sequences) are the same call, and causality is just each token's length.

A model mixing windowed and global layers (Gemma 3, gpt-oss) keeps only its global layers in the
pool; its windowed layers keep a ring of W slots per sequence in the engine's state rows
(rl_models.paged_window), so their keys and values take window-sized room.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from rl_models import gemma4, lora, paged_hybrid, paged_layered, paged_window
from rl_models import transformer as tf
from rl_models.block import normed
from rl_models.layers import fused_linear
from rl_models.moe import MoE
from rl_models.rope import rope_tables, rotate


def paged_cache_spec(model: tf.Transformer) -> tuple[int, int, int, Any]:
    """(layers, kv heads, head dim, dtype) of the key/value pool, in the compute dtype: every
    attention layer's but a hybrid's linear-attention layers and a mixed model's windowed layers,
    which keep per-sequence states (rl_models.paged_hybrid, rl_models.paged_window)."""
    cfg = model.config
    layers = cfg.num_layers - cfg.kinds().count("linear_attention")
    windowed = paged_window.windowed_layers(cfg)
    if windowed is not None:
        layers -= sum(windowed)
    return layers, cfg.num_kv_heads, cfg.head_dim, tf.compute_dtype(cfg)


def _layer(block: tf.Block, x: jax.Array, rope: tuple[jax.Array, jax.Array], pages: Any,
           layer: jax.Array, page_rows: jax.Array, positions: jax.Array, kv: Any,
           window: int | jax.Array | None) -> tuple[jax.Array, Any, jax.Array | None]:
    """One block for N single-token queries: x [N, 1, D] (the decode shapes of `Block`); a
    windowed layer's tokens attend to their last `window` positions only. Also the experts its
    router chose [N, k] (None for a dense MLP)."""
    cfg = block.attn.config
    n = x.shape[0]
    h, kvh, dh = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    attn = block.attn
    qkv = fused_linear(normed(block.attn_norm, x), (attn.q_proj, attn.k_proj, attn.v_proj))
    q, k, v = qkv[..., : h * dh], qkv[..., h * dh : (h + kvh) * dh], qkv[..., (h + kvh) * dh :]
    q, k, v = q.reshape(n, 1, h, dh), k.reshape(n, 1, kvh, dh), v.reshape(n, 1, kvh, dh)
    q, k = attn.normed(q, k)
    q, k = rotate(q, *rope), rotate(k, *rope)
    extra = {} if window is None else {"window": window}
    if attn.sinks is not None:  # gpt-oss: each head's sink logit joins its softmax
        extra["sinks"] = attn.sinks[...]
    if cfg.attn_logit_softcapping is not None:
        extra["softcap"] = cfg.attn_logit_softcapping
    if cfg.query_scale is not None:  # the pool's attention scales by 1 / sqrt(Dh): the queries carry the rest
        q = (q.astype(jnp.float32) * (cfg.query_scale * dh ** 0.5)).astype(q.dtype)
    out, pages = kv(q[:, 0], k[:, 0], v[:, 0], pages, layer, page_rows, positions, **extra)
    h = attn.o_proj(out.reshape(n, 1, h * dh).astype(x.dtype))
    x = x + normed(block.attn_post_norm, h)
    experts = None
    if isinstance(block.mlp, MoE):
        h, routing = block.mlp.routed(normed(block.mlp_norm, x))
        experts = routing.experts[:, 0]
    else:
        h = block.mlp(normed(block.mlp_norm, x))
    return x + normed(block.mlp_post_norm, h), pages, experts


def paged_forward(model: tf.Transformer, tokens: jax.Array, positions: jax.Array, pages: Any,
                  page_rows: jax.Array, kv: Any, **state: Any) -> tuple[jax.Array, Any]:
    """Hidden states [N, D] (after the final norm) of tokens [N] at positions [N] over the
    pool, and the pool with their keys/values written; page_rows [N, M] int32. A model mixing
    windowed and global layers takes `state` (states, state_rows, sequence: its windowed layers'
    rings, rl_models.paged_window) and returns (pool, rings) as its second output."""
    hidden, pages, _ = paged_forward_routed(model, tokens, positions, pages, page_rows, kv, **state)
    return hidden, pages


def _mixed_forward(model: tf.Transformer, x: jax.Array, settings: tf.LayerSettings, pages: Any, page_rows: jax.Array,
                   positions: jax.Array, kv: Any, windowed: tuple[bool, ...], states: Any, state_rows: jax.Array,
                   sequence: bool) -> tuple[jax.Array, Any, list[jax.Array | None]]:
    """The layers unrolled, global ones over the pool (indexed among the global layers), windowed
    ones over their rings (indexed among the windowed layers): (x, (pool, rings), experts per layer)."""
    graphdef, stacked = nnx.split(model.layers)

    def ring(q, k, v, rings, layer, page_rows, positions, window, sinks=None, softcap=None):
        return paged_window.ring_attention(q, k, v, rings, layer, state_rows, positions, window, sequence=sequence,
                                           sinks=sinks, softcap=softcap)

    chosen, n_global, n_windowed = [], 0, 0
    for i in range(model.config.num_layers):
        block = nnx.merge(graphdef, jax.tree.map(lambda a, i=i: a[i], stacked))
        rope, window = settings.at(i)
        if windowed[i]:
            x, states, e = _layer(block, x, rope, states, n_windowed, page_rows, positions, ring, window)
            n_windowed += 1
        else:
            x, pages, e = _layer(block, x, rope, pages, jnp.int32(n_global), page_rows, positions, kv, window)
            n_global += 1
        chosen.append(e)
    return x, (pages, states), chosen


def paged_forward_routed(model: tf.Transformer, tokens: jax.Array, positions: jax.Array, pages: Any,
                         page_rows: jax.Array, kv: Any, *, states: Any = None, state_rows: jax.Array | None = None,
                         sequence: bool = False) -> tuple[jax.Array, Any, jax.Array | None]:
    """`paged_forward`, and the experts each layer's router chose for each token, [N, layers, k]
    int32 (None for a dense model): what the engine records for routing replay."""
    cfg = model.config
    if not isinstance(model.layers, tf.Block):  # the blocks' parameters stacked on a leading layer axis
        raise NotImplementedError(f"paged_forward runs stacked layers (one Block); got {type(model.layers).__name__}")
    x = tf.embed_tokens(model, tokens)[:, None]  # [N, 1, D]
    settings = tf.LayerSettings(cfg, rope_tables(cfg, positions[:, None]))
    windowed = paged_window.windowed_layers(cfg)
    if windowed is not None:
        if states is None or state_rows is None:
            raise ValueError("a model mixing windowed and global layers runs with its rings (states=, state_rows=)")
        x, pages, chosen = _mixed_forward(model, x, settings, pages, page_rows, positions, kv, windowed, states,
                                          state_rows, sequence)
        experts = None if chosen[0] is None else jnp.swapaxes(jnp.stack(chosen), 0, 1)
        return model.final_norm(x)[:, 0], pages, experts
    graphdef, stacked = nnx.split(model.layers)

    def body(carry, xs, static=None):
        x, pages = carry
        state, i = xs
        rope, window = settings.at(i if static is None else static)
        x, pages, experts = _layer(nnx.merge(graphdef, state), x, rope, pages, i, page_rows, positions, kv, window)
        return (x, pages), experts

    layers = jnp.arange(cfg.num_layers, dtype=jnp.int32)
    if tf.scans_layers(cfg):
        (x, pages), experts = jax.lax.scan(body, (x, pages), (stacked, layers))
    else:  # unrolled (CPU), as Transformer runs its layers: each reads its own slice (see Transformer.loop_view)
        chosen = []
        for i in range(cfg.num_layers):
            (x, pages), e = body((x, pages), (jax.tree.map(lambda a, i=i: a[i], stacked), layers[i]), static=i)
            chosen.append(e)
        experts = None if chosen[0] is None else jnp.stack(chosen)
    return model.final_norm(x)[:, 0], pages, None if experts is None else jnp.swapaxes(experts, 0, 1)


def inference_copy(model: tf.Transformer) -> tf.Transformer:
    """A plain model that computes what `model` computes, for decoding: every parameter
    in the compute dtype, quantized kernels dequantized and LoRA adapters merged into
    their kernels (`rl_models.lora.merged_kernel`), so adapters are never dropped and
    decoding pays no adapter matmuls. Traceable (the engine runs it in its jitted refresh).
    """
    config = dataclasses.replace(model.config, param_dtype=model.config.dtype)
    # the model's own class, so a subclass (e.g. one with an extra output rule) keeps its behaviour
    graphdef, plain = nnx.split(nnx.eval_shape(lambda: type(model)(config, rngs=nnx.Rngs(0))))
    values = nnx.to_pure_dict(nnx.state(model, nnx.Param))
    linears = lora.linears(model)

    def fill(path, abstract):
        keys = tuple(str(getattr(k, "key", k)) for k in path)
        owner = "/".join(keys[:-1])
        if keys[-1] == "kernel" and owner in linears:
            return lora.merged_kernel(linears[owner]).astype(abstract.dtype)
        node = values
        for k in keys:
            node = node[k]
        return jnp.asarray(node, abstract.dtype)

    return nnx.merge(graphdef, jax.tree_util.tree_map_with_path(fill, nnx.to_pure_dict(plain)))


class TransformerPaging:
    """`rl_core.policy.protocols.PagedModel` for `Transformer` and its subclasses, plain or with LoRA
    adapters over a full or quantized base (`inference_copy` merges them, so `cache_spec` and
    `forward` see a plain model). Subclass it to wrap one of them (e.g. a benchmark's timing)."""

    def cache_spec(self, model: tf.Transformer) -> tuple[int, int, int, Any]:
        if model.config.layered:  # Gemma 4: the global layers with their own keys and values
            return paged_layered.pool_spec(model)  # type: ignore[arg-type]
        return paged_cache_spec(model)

    def state_spec(self, model: tf.Transformer, max_tokens: int | None = None) -> Any:
        """One sequence's fixed-size state: a hybrid's linear-attention states (rl_models.paged_hybrid),
        a mixed windowed/global model's rings of its windowed layers (rl_models.paged_window; no
        longer than `max_tokens`, the most positions a sequence holds); None for a model with neither."""
        if model.config.hybrid:
            return paged_hybrid.state_spec(model)
        if model.config.layered:
            return paged_layered.ring_spec(model, max_tokens)  # type: ignore[arg-type]
        return paged_window.ring_spec(model, max_tokens)

    def state_axes(self, model: tf.Transformer) -> Any:
        """Logical axes of each `state_spec` leaf ([layers, ...]): a ring's kv heads split over `tensor`
        as the page pool's do; None (whole on each replica's devices) for a hybrid's states."""
        if model.config.layered:
            return None if paged_layered.ring_spec(model) is None else (paged_window.RING_AXES,) * 2  # type: ignore[arg-type]
        if model.config.hybrid or paged_window.windowed_layers(model.config) is None:
            return None
        return (paged_window.RING_AXES,) * 2

    def fresh_states_share_chunks(self, model: tf.Transformer) -> bool:
        """A mixed windowed/global model's prefill chunk may add prompts that start at position 0
        (their rings hold nothing yet to read); a hybrid's linear-attention chunk is one sequence's."""
        if model.config.layered:
            return paged_layered.ring_spec(model) is not None  # type: ignore[arg-type]
        return not model.config.hybrid and paged_window.windowed_layers(model.config) is not None

    def kv_window(self, model: tf.Transformer) -> int | None:
        """The most key slots any layer still reads behind a query when every attention layer is
        windowed (Mistral v0.1); None when some layer reads the whole sequence."""
        windows = tf.layer_windows(model.config)
        if model.config.layered or model.config.hybrid or not windows or tf.FULL_WINDOW in windows:
            return None
        return max(windows)

    def forward(self, model: tf.Transformer, tokens: jax.Array, positions: jax.Array, pages: Any,
                page_rows: jax.Array, kv: Any, **state: Any) -> tuple[jax.Array, Any]:
        """`paged_forward`; with `state` (states, state_rows, sequence: a model with a `state_spec`)
        `rl_models.paged_hybrid.paged_hybrid_forward`, whose second output is (pool, states)."""
        if model.config.hybrid:
            return paged_hybrid.paged_hybrid_forward(model, tokens, positions, pages, page_rows, kv, **state)
        if model.config.layered:
            return paged_layered.paged_layered_forward(model, tokens, positions, pages, page_rows, kv, **state)[:2]  # type: ignore[arg-type]
        return paged_forward(model, tokens, positions, pages, page_rows, kv, **state)

    def forward_routed(self, model: tf.Transformer, tokens: jax.Array, positions: jax.Array, pages: Any,
                       page_rows: jax.Array, kv: Any, **state: Any) -> tuple[jax.Array, Any, jax.Array | None]:
        if model.config.hybrid:  # its experts' routing with experts (Qwen3.5-MoE), else None
            return paged_hybrid.paged_hybrid_forward_routed(model, tokens, positions, pages, page_rows, kv, **state)
        if model.config.layered:  # no experts: routing None
            return paged_layered.paged_layered_forward(model, tokens, positions, pages, page_rows, kv, **state)  # type: ignore[arg-type]
        return paged_forward_routed(model, tokens, positions, pages, page_rows, kv, **state)

    def inference_copy(self, model: tf.Transformer) -> tf.Transformer:
        return inference_copy(model)

    def loop_stacks(self, model: tf.Transformer) -> tuple[str, ...]:
        """The parameters the engine keeps as one array per layer (rl_core.rollout.unstacked):
        the stacked blocks when they run unrolled (CPU), none when scanned (the scan reads its slices)."""
        if model.config.hybrid:  # its paged forward runs unrolled on every platform
            return ("layers", "linear_layers")
        if model.config.layered:  # so does Gemma 4's, over its stacks of each shape
            return tuple(s for s in gemma4.STACKS if getattr(model, s) is not None)
        if paged_window.windowed_layers(model.config) is not None:  # so does a mixed model's (rings or pool per layer)
            return ("layers",)
        return () if tf.scans_layers(model.config) else ("layers",)


PAGED_TRANSFORMER = TransformerPaging()
"""The paged engine's adapter for rl_models' transformers (`paging=` of the learner and the engine)."""
