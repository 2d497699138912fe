"""What a model's rollout engine keeps per token and per sequence, as `rl_core.rollout.MemoryQuery`
takes it: one count for the policy's engine (trainer.plan.planner) and a judge's (trainer.plan.judge).

  - every attention layer's keys and values per token (`kv_token_bytes`), windowed ones included
    (the paged engine pages them unless it rings them); a hybrid's linear-attention layers keep a
    fixed recurrent state instead (`state_bytes`);
  - the static sampler's cache of `rows` rows of `seq` slots (`dense_cache_bytes`): its own
    (rl_core.policy.decode_cache, on shapes: a windowed layer's ring of min(W, seq) slots, a
    hybrid's recurrent state), split over the mesh by its own axes as the sampler places it;
  - every layer windowed (Mistral v0.1): the window, whose pages the paged engine gives back;
  - windowed and global layers mixed (Gemma 3): the windowed layers' share per token and their
    ring's slots (rl_models.paged_window), which the paged engine keeps in state rows;
  - layers sharing keys and values (Gemma 4's last num_kv_shared_layers): only the layers that
    compute them count, each at its own KV heads and head size (rl_models.paged_layered).
"""

from __future__ import annotations

from typing import Any


def kv_query_fields(config: Any, model: Any, *, rows: int, seq: int, mesh: Any = None,
                    platform: str | None = None) -> tuple[dict[str, Any], int]:
    """(the KV fields of a MemoryQuery, the recurrent state's bytes in its `dense_cache_bytes`) for
    `model` (an abstract module of `config`) generating `rows` rows of `seq` tokens, bytes per
    device of `mesh` (None: one device). On `platform` "tpu" a token's keys and values take the
    paged pool's lane-packed layout (rl_core.rollout.ragged.token_lanes: heads of 80 pad to 128
    lanes, an odd count of heads of 64 a zero head, lane groups up to a count the kernel tiles)."""
    import jax
    import jax.numpy as jnp
    from rl_core.policy import decode_cache
    from rl_core.rollout import per_device, token_lanes
    from rl_core.runtime import mesh as mesh_lib
    from rl_models import paged_layered
    from rl_models.gemma4 import cache_layers
    from rl_models.paged_window import ring_spec
    from rl_models.transformer import FULL_WINDOW, layer_windows

    cbytes = jnp.dtype(config.dtype).itemsize
    windows = layer_windows(config)
    kv_layers = config.num_layers - config.kinds().count("linear_attention")
    ways = 1 if mesh is None else mesh_lib.batch_devices(mesh)
    # the static sampler's own cache (rl_core.policy.decode_cache: rings for windowed layers, a hybrid's
    # state), on shapes, split over the mesh by its own axes as the sampler places it
    axes: dict[str, Any] = {}

    def init() -> Any:
        cache, axes["cache"] = decode_cache(model, rows, seq)
        return cache

    def placed(x: Any, names: Any) -> Any:
        sharding = None if mesh is None else mesh_lib.logical_sharding(tuple(names), x.shape, mesh)
        return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)

    shapes = jax.eval_shape(init)
    cache = per_device(jax.tree.map(placed, shapes, axes["cache"]))
    recurrent = model.recurrent_state_bytes(-(-rows // ways)) if config.hybrid else 0
    rings = paged_layered.ring_spec(model) if config.layered else ring_spec(model)

    def lanes_of(kv_heads: int, head_dim: int) -> int:  # lanes a token's keys (or values) take in a layer
        return token_lanes(kv_heads, head_dim) if platform == "tpu" else kv_heads * head_dim

    # every layer with its own keys and values (Gemma 4's sharing layers keep none), each of its own shape
    kv_shapes = ([config.layer_shape(i) for i in cache_layers(config)] if config.layered
                 else [(config.num_kv_heads, config.head_dim)] * kv_layers)
    return dict(
        num_kv_heads=min((k for k, _ in kv_shapes), default=config.num_kv_heads), compute_bytes=cbytes,
        kv_token_bytes=2 * sum(lanes_of(k, dh) for k, dh in kv_shapes) * cbytes,
        dense_cache_bytes=cache,
        state_bytes=model.recurrent_state_bytes if config.hybrid else None,
        window=max(windows) if not config.hybrid and FULL_WINDOW not in windows else None,
        ring_token_bytes=sum(per_device(x) for x in rings) // rings[0].shape[1] if rings else 0,
        ring_window=rings[0].shape[1] if rings else 0), recurrent
