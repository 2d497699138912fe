"""What a model's rollout engine keeps per token and per sequence, as `rl_core.rollout.MemoryQuery`
takes it: one count for the policy's engine (trainer.plan.planner) and a judge's (trainer.plan.judge).

  - every attention layer's keys and values per token (`kv_token_bytes`), windowed ones included
    (the paged engine pages them unless it rings them); a hybrid's linear-attention layers keep a
    fixed recurrent state instead (`state_bytes`);
  - the static sampler's cache of `rows` rows of `seq` slots (`dense_cache_bytes`): a windowed
    layer's a ring of min(W, seq) slots (rl_models.rings), split over the mesh as its cache is;
  - every layer windowed (Mistral v0.1): the window, whose pages the paged engine gives back;
  - windowed and global layers mixed (Gemma 3): the windowed layers' share per token and their
    ring's slots (rl_models.paged_window), which the paged engine keeps in state rows.
"""

from __future__ import annotations

import math
from typing import Any


def kv_query_fields(config: Any, model: Any, *, rows: int, seq: int, mesh: Any = None) -> tuple[dict[str, Any], int]:
    """(the KV fields of a MemoryQuery, the recurrent state's bytes in its `dense_cache_bytes`) for
    `model` (an abstract module of `config`) generating `rows` rows of `seq` tokens, bytes per
    device of `mesh` (None: one device)."""
    import jax.numpy as jnp
    from rl_core.rollout import per_device
    from rl_core.runtime import mesh as mesh_lib
    from rl_models.paged_window import ring_spec
    from rl_models.transformer import FULL_WINDOW, layer_windows

    cbytes = jnp.dtype(config.dtype).itemsize
    kinds, windows = config.kinds(), layer_windows(config)
    kv_layers = config.num_layers - kinds.count("linear_attention")
    split, ways = 1, 1
    if mesh is not None:
        spec = mesh_lib.logical_spec(("layers", "batch", "kv_heads", "cache_slots", "head_dim"),
                                     (kv_layers, rows, config.num_kv_heads, seq, config.head_dim), mesh)
        split = math.prod(math.prod(mesh.shape[a] for a in ((x,) if isinstance(x, str) else x))
                          for x in spec if x is not None)
        ways = mesh_lib.batch_devices(mesh)
    slots = sum(min(w, seq) for w, kind in zip(windows, kinds, strict=True) if kind != "linear_attention")
    cache = 2 * slots * rows * config.num_kv_heads * config.head_dim * cbytes // split
    recurrent = model.recurrent_state_bytes(-(-rows // ways)) if config.hybrid else 0
    rings = ring_spec(model)
    return dict(
        num_kv_heads=config.num_kv_heads, compute_bytes=cbytes,
        kv_token_bytes=2 * kv_layers * config.num_kv_heads * config.head_dim * cbytes,
        dense_cache_bytes=cache + recurrent,
        state_bytes=model.recurrent_state_bytes if config.hybrid else None,
        window=max(windows) if not config.hybrid and FULL_WINDOW not in windows else None,
        ring_token_bytes=sum(per_device(x) for x in rings) // rings[0].shape[1] if rings else 0,
        ring_window=rings[0].shape[1] if rings else 0), recurrent
