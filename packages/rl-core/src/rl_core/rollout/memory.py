"""What a rollout engine holds on each device while it generates: the planner's question to it.

`trainer plan` (and its judge's count) builds a `MemoryQuery` from the model's shapes and the run's
rollout settings and asks the engine the run uses (`rl_core.rollout.engines.Engine.memory`) for an
`EngineMemory`; it never branches on an engine's name. rl_core's two answers are here:

  - `static_memory`: the one-program sampler, compiled on abstract arrays (its KV cache and
    temporaries, as XLA assigns them), plus the cast copy `rollout.weights_dtype` makes;
  - `paged_memory`: counted from the shapes: one page pool per replica (split over `tensor` on KV
    heads), a recurrent model's state rows, a mixed windowed/global model's window-sized rings,
    and a weight copy in the compute dtype laid out for decoding (`DECODE_RULES`).

An engine in another process (the trainer's `remote`) holds nothing on the trainer's devices.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from rl_core.config import RolloutConfig
from rl_core.rollout.paged import DECODE_RULES, EngineSettings
from rl_core.rollout.sampler import Sampler, SamplingParams
from rl_core.rollout.weights import cast_weights
from rl_core.runtime import mesh as mesh_lib


@dataclasses.dataclass(frozen=True, kw_only=True)
class MemoryQuery:
    """What the planner tells an engine about a run; bytes are asked per device of `mesh`."""

    rollout: RolloutConfig
    graphdef: Any
    """The policy's `nnx.GraphDef`."""
    weights: Any
    """The whole model's parameters as `update_weights` gets them: `jax.ShapeDtypeStruct`s with shardings."""
    variables: Any
    """The same parameters as an abstract `nnx.State` (their `nnx.Variable`s, with sharding metadata)."""
    mesh: Any = None
    """The run's `jax.sharding.Mesh` (None: one device)."""
    param_shardings: Any = None
    """Shardings of `weights` (None without a mesh)."""
    prompts: int
    """Prompts per rollout (U)."""
    samples: int
    """Completions per prompt (G)."""
    batch_size: int | None
    """Completions the engine is built for (`EngineBuild.batch_size`; None: its own default)."""
    prompt_tokens: int
    """Longest prompt (P)."""
    new_tokens: int
    """Most new tokens a completion takes (T)."""
    mean_new_tokens: int
    """The mean completion length at which memory in use (not reserved) is counted."""
    num_kv_heads: int
    kv_token_bytes: int
    """One token's keys and values over every layer in the compute dtype, on one device (unsplit)."""
    compute_bytes: int
    """Bytes of one value in the compute dtype."""
    dense_cache_bytes: int
    """Per device: a KV cache of every row at full length (P + T), a windowed layer's at min(W, P + T)
    (its ring), linear-attention state included, as a one-program sampler holds it."""
    compiled: Callable[..., tuple[int, int, int]]
    """`(jitted, *args)` -> per-device (argument, output, temporary) bytes of the compiled program."""
    state_bytes: Callable[[int], int] | None = None
    """A model with a recurrent state (Qwen3.5's linear attention): `rows` -> bytes of that many
    sequences' state, whole on one device (None: none)."""
    window: int | None = None
    """The largest attention window when every layer is windowed (None: some layer sees everything)."""
    ring_token_bytes: int = 0
    """A model mixing windowed and global layers (Gemma 3): of `kv_token_bytes`, its windowed
    layers' share, which the paged engine keeps in a ring of `ring_window` slots per sequence
    (rl_models.paged_window) rather than in its pages (0: no such layers)."""
    ring_window: int = 0
    """The windowed layers' largest window (a ring's slots, unless every sequence is shorter)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class EngineMemory:
    """An engine's answer to a `MemoryQuery`: per device, while it generates."""

    held_bytes: int
    """Everything it holds beyond the trained weights (what the plan's rollout program counts)."""
    cache_bytes: int = 0
    """Of that, its KV cache (a sampler's cache, a page pool)."""
    weight_bytes: int = 0
    """Of that, its own copy of the weights (none: it samples the trained ones)."""
    compiled_weight_bytes: int | None = None
    """The weights as its compiled program takes them (None: it compiles none the plan measures)."""
    compiled: dict[str, int | None] = dataclasses.field(default_factory=dict)
    """Entries for the plan's measured column (from compiled programs)."""
    analytic: dict[str, int] = dataclasses.field(default_factory=dict)
    """Entries for the plan's counted column."""
    rows: tuple[tuple[str, str | None, str | None], ...] = ()
    """The plan table's lines for it: (label, key of `compiled`, key of `analytic`); a key may name
    one of the plan's own entries (e.g. `kv_cache`, the dense cache)."""


def per_device(tree: Any) -> int:
    """Bytes one device holds of the abstract arrays in `tree` (their shardings' shard shapes)."""
    total = 0
    for s in jax.tree.leaves(tree):
        shape = s.sharding.shard_shape(s.shape) if getattr(s, "sharding", None) is not None else s.shape
        total += math.prod(shape) * jnp.dtype(s.dtype).itemsize
    return total


# takes any arrays and reads none: its compiled arguments are the arrays as this host's compiler lays them out
_HOLD = jax.jit(lambda *arrays: None, keep_unused=True)


def argument_bytes(tree: Any, sizes: Callable[..., tuple[int, int, int]] | None = None) -> int:
    """Bytes one device holds of the abstract arrays in `tree` as a compiled program's arguments, as
    the compiler lays them out: what to take from a program's argument size to leave the rest of its
    arguments. XLA:CPU lays arrays out dense (`per_device`); XLA:TPU pads each to its tiles (on a
    v5e a float32 [64] vector takes 512 bytes, the tiny preset's 346,880 bytes of weights 461,312).
    `sizes` (a planner's `MemoryQuery.compiled`) compiles as the planner does, for its platform;
    without it, for the arrays' own devices."""
    leaves = [x for x in jax.tree.leaves(tree) if hasattr(x, "shape") and hasattr(x, "dtype")]
    if not leaves:
        return 0
    if sizes is not None:
        return sizes(_HOLD, *leaves)[0]
    stats = _HOLD.lower(*leaves).compile().memory_analysis()
    return per_device(leaves) if stats is None else stats.argument_size_in_bytes


def static_memory(q: MemoryQuery) -> EngineMemory:
    """The sampler's program compiled for the run's prompts (its cache and temporaries), and the
    copy `rollout.weights_dtype` casts (the generator's own cast_weights, traced on shapes; a leaf
    it casts is a new buffer, the others pass through)."""
    weights = q.weights
    if q.rollout.weights_dtype is not None:
        cast = jax.eval_shape(lambda w: cast_weights(w, q.rollout.weights_dtype), q.weights)
        weights = jax.tree.map(
            lambda s, c: s if c.dtype == s.dtype else jax.ShapeDtypeStruct(s.shape, c.dtype, sharding=s.sharding),
            q.weights, cast)
    copy = per_device([new for old, new in zip(jax.tree.leaves(q.weights), jax.tree.leaves(weights), strict=True)
                       if new is not old])
    sampler = Sampler(q.graphdef, max_new_tokens=q.new_tokens, eos_ids=(0,), pad_id=0, mesh=q.mesh,
                      param_shardings=q.param_shardings)
    ways = mesh_lib.batch_devices(q.mesh) if q.mesh is not None else 1
    one = jax.sharding.SingleDeviceSharding(jax.devices()[0]) if q.mesh is None else None
    prompts = jax.ShapeDtypeStruct((q.prompts, q.prompt_tokens), jnp.int32, sharding=one)
    mask = jax.ShapeDtypeStruct((q.prompts, q.prompt_tokens), jnp.float32, sharding=one)
    rows = q.prompts * q.samples
    program = sampler._jit(q.prompts % ways == 0, rows % ways == 0)
    args, out, temp = q.compiled(program, weights, prompts, mask, jax.random.key(0),
                                 SamplingParams.from_rollout(q.rollout), q.samples)
    lines = [("rollout: KV cache + sampler temporaries", "rollout_temporaries", "kv_cache")]
    if q.rollout.weights_dtype is not None and copy:
        lines.append(("rollout: weight copy in rollout.weights_dtype", None, "rollout_weight_copy"))
    return EngineMemory(held_bytes=out + temp + copy, cache_bytes=q.dense_cache_bytes, weight_bytes=copy,
                        compiled_weight_bytes=args - argument_bytes((prompts, mask, program.stops), q.compiled),
                        compiled={"rollout_temporaries": out + temp}, analytic={"rollout_weight_copy": copy},
                        rows=tuple(lines))


def paged_memory(q: MemoryQuery) -> EngineMemory:
    """One replica per data/fsdp device, each with its own page pool split over tensor on KV heads,
    and weights in the compute dtype split over tensor only; in use at `mean_new_tokens`: each
    replica's share of the prompts (dealt round-robin) once, and each completion's tokens rounded
    up to whole pages (plus one page of room). A mixed windowed/global model's windowed layers
    are in rings instead of pages: a pool of state rows of `ring_window` slots each, split over
    tensor on KV heads as the pages are, in use one per prompt and one per completion."""
    replicas = mesh_lib.batch_devices(q.mesh) if q.mesh is not None else 1
    engine = EngineSettings.from_rollout(q.rollout, batch_size=q.batch_size, replicas=replicas)
    tensor = q.mesh.shape["tensor"] if q.mesh is not None else 1
    split = tensor if q.num_kv_heads % tensor == 0 else 1
    token_kv = (q.kv_token_bytes - q.ring_token_bytes) // split
    pool = engine.pool_pages * engine.page_size * token_kv
    pages = lambda n: -(-n // engine.page_size)  # noqa: E731
    prompts_here = -(-q.prompts // replicas)
    own = pages(q.mean_new_tokens) + 1
    if q.window is not None:  # every layer windowed: a sample gives back the pages behind its window
        own = min(own, (q.window - 1) // engine.page_size + 2)
    in_use = (prompts_here * pages(q.prompt_tokens) + prompts_here * q.samples * own) * engine.page_size * token_kv
    # a recurrent model's state pool: one sequence's state per row, whole on each replica's device
    states = q.state_bytes(engine.state_pool_rows) if q.state_bytes is not None else 0
    ring_slots = min(q.ring_window, engine.pages_per_sequence * engine.page_size)  # no longer than a sequence
    ring = ring_slots * q.ring_token_bytes // split  # one sequence's rings
    rings = engine.state_pool_rows * ring
    in_use += (prompts_here + prompts_here * q.samples) * ring

    def decode_shard(v: Any) -> int:
        if q.mesh is None:
            return math.prod(v.shape)
        spec = mesh_lib.logical_spec(v.get_metadata("out_sharding", None) or (None,) * len(v.shape), v.shape,
                                     q.mesh, DECODE_RULES)
        return math.prod(jax.sharding.NamedSharding(q.mesh, spec).shard_shape(v.shape))

    weights = sum(decode_shard(v) * q.compute_bytes
                  for v in jax.tree.leaves(q.variables, is_leaf=lambda x: isinstance(x, nnx.Variable)))
    state_row = (("rollout engine (paged): linear-attention state rows", None, "engine_state_pool"),) if states else ()
    # the windowed layers' rings of W slots, one per state row
    ring_row = ((f"rollout engine (paged): {ring_slots}-slot KV rings", None, "engine_ring_pool"),) if rings else ()
    return EngineMemory(
        held_bytes=pool + states + rings + weights, cache_bytes=pool + states + rings, weight_bytes=weights,
        analytic={"engine_kv_pool": pool, "engine_kv_in_use": in_use, "engine_state_pool": states,
                  "engine_ring_pool": rings, "engine_weights": weights},
        rows=(("rollout engine (paged): KV page pool", None, "engine_kv_pool"),
              *ring_row,
              (f"  in use at a mean of {q.mean_new_tokens} new tokens", None, "engine_kv_in_use"),
              *state_row,
              ("  the static sampler's KV cache would be", None, "kv_cache"),
              ("rollout engine: inference weight copy", None, "engine_weights")))


def memory_elsewhere(q: MemoryQuery) -> EngineMemory:
    """An engine in another process: its cache and weights are on its own devices, none on the trainer's."""
    return EngineMemory(held_bytes=0, rows=((f"rollout engine ({q.rollout.engine}): on its servers, none here",
                                             None, None),))
