"""A hybrid model (Qwen3.5, rl_models.hybrid) over the paged engine's pools: its attention
layers read and write the paged KV like the transformer's (rl_models.paged); its
linear-attention layers keep a fixed-size state per sequence in a pool of state rows beside it.

Shapes: N tokens, M pages per sequence, Q state rows, n linear-attention layers.

The state pool is (conv [n, Q, K - 1, C], recurrent [n, Q, Hv, Dk, Dv] float32), one row per
sequence the engine holds (`state_spec`); row 0 is scratch. Each token names its sequence's row
(`state_rows` [N], 0 for padding and inactive slots, which leave every row as it was). A call is
one of two kinds:
- `sequence=True`, a prefill chunk: the N tokens are one sequence's consecutive tokens, real
  ones first (`state_rows[0]` is its row), run as one row through the chunked delta rule from
  the state the row holds;
- `sequence=False`, decoding: N sequences' next tokens, each from its own row (the recurrence).
A token at position 0 starts its sequence afresh, whatever its row held before.
With experts (Qwen3.5-MoE) each layer's MLP is the MoE, and `paged_hybrid_forward_routed` also
gives the experts each layer's router chose for each token (what the engine records for routing
replay).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from rl_models.gated_attention import rotate_partial
from rl_models.hybrid import HybridTransformer
from rl_models.moe import MoE
from rl_models.rope import rope_cos_sin, rope_inv_freq
from rl_models.transformer import compute_dtype


def state_spec(model: HybridTransformer) -> tuple[jax.ShapeDtypeStruct, jax.ShapeDtypeStruct]:
    """(conv, recurrent) of one sequence: [n, K - 1, C] in the compute dtype, [n, Hv, Dk, Dv] float32."""
    conv, rec = jax.eval_shape(lambda: model.init_cache(1, 1)[1])
    return tuple(jax.ShapeDtypeStruct((s.shape[0], *s.shape[2:]), s.dtype) for s in (conv, rec))


def _mlp(block: Any, y: jax.Array) -> tuple[jax.Array, jax.Array | None]:
    """y [B, L, D] + the block's MLP of its norm, and with experts the ones chosen [B, L, k] (else None)."""
    if isinstance(block.mlp, MoE):
        h, routing = block.mlp.routed(block.mlp_norm(y))
        return y + h, routing.experts
    return y + block.mlp(block.mlp_norm(y)), None


def _attention(block: Any, x: jax.Array, rope: tuple[jax.Array, jax.Array], pages: Any, layer: int,
               page_rows: jax.Array, positions: jax.Array, kv: Any) -> tuple[jax.Array, Any, jax.Array | None]:
    """x [N, D] + the block's gated attention over the pool, then its MLP (and its experts [N, k])."""
    cfg = block.attn.config
    n = x.shape[0]
    h, kvh, dh = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    attn = block.attn
    y = block.attn_norm(x[:, None])  # [N, 1, D]: each token its own query
    if cfg.attention_output_gate:  # q_proj gives each head its query and its gate (rl_models.gated_attention)
        qg = attn.q_proj(y).reshape(n, 1, h, 2 * dh)
        q, gate = qg[..., :dh], qg[..., dh:].reshape(n, 1, h * dh)
    else:
        q, gate = attn.q_proj(y).reshape(n, 1, h, dh), None
    k, v = attn.k_proj(y).reshape(n, 1, kvh, dh), attn.v_proj(y).reshape(n, 1, kvh, dh)
    if attn.q_norm is not None and attn.k_norm is not None:
        q, k = attn.q_norm(q), attn.k_norm(k)
    q, k = rotate_partial(q, *rope), rotate_partial(k, *rope)
    out, pages = kv(q[:, 0], k[:, 0], v[:, 0], pages, jnp.int32(layer), page_rows, positions)
    out = out.reshape(n, 1, h * dh).astype(x.dtype)
    if gate is not None:
        out = out * jax.nn.sigmoid(gate.astype(jnp.float32)).astype(out.dtype)
    x = x + attn.o_proj(out)[:, 0]
    y, experts = _mlp(block, x[:, None])
    return y[:, 0], pages, None if experts is None else experts[:, 0]


def _linear(block: Any, x: jax.Array, states: tuple[jax.Array, jax.Array], layer: int, state_rows: jax.Array,
            positions: jax.Array, sequence: bool
            ) -> tuple[jax.Array, tuple[jax.Array, jax.Array], jax.Array | None]:
    """x [N, D] + the block's linear attention from (and into) the tokens' state rows, then its MLP
    (and its experts [N, k])."""
    conv_pool, rec_pool = states
    valid, reset = state_rows > 0, positions == 0
    if sequence:  # one row of N tokens: [1, N, D], the state of the chunk's row
        rows = state_rows[:1]
        y, valid, reset = x[None], valid[None], reset[None]
    else:  # N rows of one token
        rows = state_rows
        y, valid, reset = x[:, None], valid[:, None], reset[:, None]
    state = (conv_pool[layer, rows], rec_pool[layer, rows])
    h, (conv, rec) = block.linear_attn(block.attn_norm(y), valid, reset, state, hold=True)
    # rows of padding (0) and inactive slots write back what they read: row 0 stays as it was
    states = (conv_pool.at[layer, rows].set(conv.astype(conv_pool.dtype)), rec_pool.at[layer, rows].set(rec))
    y, experts = _mlp(block, y + h)
    if experts is not None:
        experts = experts[0] if sequence else experts[:, 0]
    return (y[0] if sequence else y[:, 0]), states, experts


def paged_hybrid_forward(model: HybridTransformer, tokens: jax.Array, positions: jax.Array, pages: Any,
                         page_rows: jax.Array, kv: Any, *, states: tuple[jax.Array, jax.Array],
                         state_rows: jax.Array, sequence: bool) -> tuple[jax.Array, tuple[Any, Any]]:
    """Hidden states [N, D] (after the final norm) and (pool, states) with the tokens' keys, values
    and states written (see the module docstring); the layers run unrolled, each reading its slice."""
    hidden, written, _ = paged_hybrid_forward_routed(model, tokens, positions, pages, page_rows, kv, states=states,
                                                     state_rows=state_rows, sequence=sequence)
    return hidden, written


def paged_hybrid_forward_routed(model: HybridTransformer, tokens: jax.Array, positions: jax.Array, pages: Any,
                                page_rows: jax.Array, kv: Any, *, states: tuple[jax.Array, jax.Array],
                                state_rows: jax.Array, sequence: bool
                                ) -> tuple[jax.Array, tuple[Any, Any], jax.Array | None]:
    """`paged_hybrid_forward`, and the experts each layer's router chose for each token, [N, layers,
    k] int32, layers in model order (None without experts)."""
    cfg = model.config
    x = jnp.take(model.embed[...], tokens, axis=0).astype(compute_dtype(cfg))  # [N, D]
    cos, sin = rope_cos_sin(positions[:, None], rope_inv_freq(cfg.rotary_dim, cfg.rope_theta, cfg.rope_scaling))
    _, linear_stack = nnx.split(model.linear_layers)
    linear_def = nnx.graphdef(model.linear_layers)
    attn_def, attn_stack = nnx.split(model.layers)
    i_linear = i_attn = 0
    chosen = []
    for kind in cfg.kinds():
        if kind == "linear_attention":
            block = nnx.merge(linear_def, jax.tree.map(lambda a, i=i_linear: a[i], linear_stack))
            x, states, experts = _linear(block, x, states, i_linear, state_rows, positions, sequence)
            i_linear += 1
        else:
            block = nnx.merge(attn_def, jax.tree.map(lambda a, i=i_attn: a[i], attn_stack))
            x, pages, experts = _attention(block, x, (cos, sin), pages, i_attn, page_rows, positions, kv)
            i_attn += 1
        chosen.append(experts)
    experts = None if chosen[0] is None else jnp.stack(chosen, axis=1)
    return model.final_norm(x), (pages, states), experts
