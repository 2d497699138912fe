"""The transformer over a paged KV cache, and the engine's inference copy.

Shapes: N tokens (each its own query: a decode slot's next token or one token
of a prefill chunk), M pages per sequence, P pages in the pool, ps page size.

The pool is (k, v), each [layers, K, P, ps, Dh] (kv-head major, the layout of
the Pallas paged-attention kernels). Token n sits at position `positions[n]`
of the sequence whose page table is `page_rows[n]`: its key/value are written
at page `page_rows[n, pos // ps]`, offset `pos % ps`, and it attends to the
first `pos + 1` slots of its sequence. So a prefill chunk (many tokens of one
sequence) and decode slots (one token of many sequences) are the same call,
and causality is just each token's length. Page 0 is the caller's scratch
page: padding tokens (all-zero page rows) write there and nobody reads it.

The attention over pages is the caller's (rl_core's reference or a Pallas
kernel): `attention(q [N, H, Dh], k_pages [K, P, ps, Dh], v_pages, page_rows,
lengths) -> [N, H, Dh]`, scale 1/sqrt(Dh) included.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp
from flax import nnx

from rl_models import transformer as tf
from rl_models.config import TransformerConfig

PagedAttention = Callable[[jax.Array, jax.Array, jax.Array, jax.Array, jax.Array], jax.Array]


def init_pages(config: TransformerConfig, num_pages: int, page_size: int) -> tf.KVCache:
    """A zeroed pool (k, v), each [layers, K, num_pages, page_size, Dh], in the compute dtype."""
    shape = (config.num_layers, config.num_kv_heads, num_pages, page_size, config.head_dim)
    dtype = tf.compute_dtype(config)
    return jnp.zeros(shape, dtype), jnp.zeros(shape, dtype)


def _layer(block: tf.Block, x: jax.Array, rope: tuple[jax.Array, jax.Array], pages: tf.KVCache,
           layer: jax.Array, page_rows: jax.Array, positions: jax.Array, attention: PagedAttention
           ) -> tuple[jax.Array, tf.KVCache]:
    """One block for N single-token queries: x [N, 1, D] (the decode shapes of `Block`)."""
    cfg = block.attn.config
    n = x.shape[0]
    h, kvh, dh = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    attn = block.attn
    qkv = tf._fused_linear(block.attn_norm(x), (attn.q_proj, attn.k_proj, attn.v_proj))
    q, k, v = qkv[..., : h * dh], qkv[..., h * dh : (h + kvh) * dh], qkv[..., (h + kvh) * dh :]
    q, k, v = q.reshape(n, 1, h, dh), k.reshape(n, 1, kvh, dh), v.reshape(n, 1, kvh, dh)
    if attn.q_norm is not None and attn.k_norm is not None:
        q, k = attn.q_norm(q), attn.k_norm(k)
    q, k = tf.rotate(q, *rope), tf.rotate(k, *rope)
    page_size = pages[0].shape[3]
    page = jnp.take_along_axis(page_rows, (positions // page_size)[:, None], axis=1)[:, 0]
    offset = positions % page_size
    # scatter each token's key/value into its slot of this layer (in place in the loop carry)
    k_pages = pages[0].at[layer, :, page, offset].set(k[:, 0].astype(pages[0].dtype))
    v_pages = pages[1].at[layer, :, page, offset].set(v[:, 0].astype(pages[1].dtype))
    out = attention(q[:, 0], k_pages[layer], v_pages[layer], page_rows, positions + 1)
    x = x + attn.o_proj(out.reshape(n, 1, h * dh).astype(x.dtype))
    return x + block.mlp(block.mlp_norm(x)), (k_pages, v_pages)


def paged_forward(model: tf.Transformer, tokens: jax.Array, positions: jax.Array, pages: tf.KVCache,
                  page_rows: jax.Array, attention: PagedAttention) -> tuple[jax.Array, tf.KVCache]:
    """Hidden states [N, D] (after the final norm) of tokens [N] at positions [N] over the
    pool, and the pool with their keys/values written; page_rows [N, M] int32."""
    cfg = model.config
    x = jnp.take(model.embed[...], tokens, axis=0).astype(tf.compute_dtype(cfg))[:, None]  # [N, 1, D]
    inv_freq = tf.rope_inv_freq(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling)  # type: ignore[arg-type]
    rope = tf.rope_cos_sin(positions[:, None], inv_freq)
    graphdef, stacked = nnx.split(model.layers)

    def body(carry, xs):
        x, pages = carry
        state, i = xs
        return _layer(nnx.merge(graphdef, state), x, rope, pages, i, page_rows, positions, attention), None

    layers = jnp.arange(cfg.num_layers, dtype=jnp.int32)
    (x, pages), _ = jax.lax.scan(body, (x, pages), (stacked, layers))
    return model.final_norm(x)[:, 0], pages


def inference_copy(model: tf.Transformer) -> tf.Transformer:
    """A plain model that computes what `model` computes, for decoding: every parameter
    in the compute dtype, quantized kernels dequantized and LoRA adapters merged into
    their kernels (`rl_models.lora.merged_kernel`), so adapters are never dropped and
    decoding pays no adapter matmuls. Traceable (the engine runs it in its jitted refresh).
    """
    from rl_models import lora  # noqa: PLC0415 (lora imports the transformer module, as this one does)

    config = dataclasses.replace(model.config, param_dtype=model.config.dtype)
    graphdef, plain = nnx.split(nnx.eval_shape(lambda: tf.Transformer(config, rngs=nnx.Rngs(0))))
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
