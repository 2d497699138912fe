"""Activation layouts by logical axis names, under the caller's mesh and rules.

Parameters carry logical axis names (`out_sharding`) that whoever places the
model maps to a mesh. Activations are named the same way, at the points where
XLA's partitioner would otherwise guess: `constrain(x, ("act_batch",
"act_length", "act_embed"))` pins x's layout when the caller traces the model
under a mesh and logical-axis rules (`jax.sharding.use_abstract_mesh` and
`flax.core.spmd.logical_axis_rules`; rl_core.runtime.mesh.activation_layout enters
both), and is the identity otherwise, so the model itself needs no mesh.

Why pin them: left alone, XLA may split a matmul over the FSDP-sharded
embedding axis of its weight and all-reduce the whole micro-batch's
activations per layer, where FSDP means rows split over devices and weights
gathered. Names used: act_batch, act_length, act_embed, act_heads,
act_kv_heads, act_mlp, act_vocab.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import jax
from flax.core import spmd
from jax.sharding import PartitionSpec


def constrain(x: jax.Array, names: Sequence[str | None], units: Sequence[int] | None = None) -> jax.Array:
    """`x` laid out by its logical axis `names` under the caller's mesh and rules; a
    dimension the named mesh axes do not divide in whole `units` stays (partly) whole
    (the rule parameters follow, so a weight and its gathered copy split alike)."""
    spec = partition_spec(names, x.shape, units)
    return x if spec is None else jax.lax.with_sharding_constraint(x, spec)


def partition_spec(names: Sequence[str | None], shape: Sequence[int],
                   units: Sequence[int] | None = None) -> PartitionSpec | None:
    """The layout `constrain` gives an array of `shape` with logical axis `names` (None outside
    a mesh and rules)."""
    rules = dict(spmd.get_logical_axis_rules())
    mesh = jax.sharding.get_abstract_mesh()
    if not rules or mesh.empty:
        return None
    if len(names) != len(shape):
        raise ValueError(f"logical axes {tuple(names)} do not match shape {tuple(shape)}")
    units = tuple(units) if units is not None else (1,) * len(shape)
    used: set[str] = set()
    spec: list[str | tuple[str, ...] | None] = []
    for name, size, unit in zip(names, shape, units, strict=True):
        target = rules.get(name) if name is not None else None
        axes = [target] if isinstance(target, str) else list(target or ())
        # a manual axis (inside shard_map) is each device's own already
        axes = [a for a in axes if a not in used and mesh.shape[a] > 1 and a not in mesh.manual_axes]
        while axes and (size // unit) % math.prod(mesh.shape[a] for a in axes):
            axes.pop()
        used.update(axes)
        spec.append(None if not axes else axes[0] if len(axes) == 1 else tuple(axes))
    return PartitionSpec(*spec)


def gathered(w: jax.Array, param_names: Sequence[str | None], units: Sequence[int] | None = None) -> jax.Array:
    """A weight in the layout its matmuls use: whole over fsdp, still split over `tensor`
    (param axis "mlp" -> activation axis "act_mlp", ...). Applied after the cast to the
    compute dtype, so FSDP's all-gather moves compute-dtype bytes, not float32 masters."""
    names = [None if n is None or n == "layers" else f"act_{n}" for n in param_names]
    return constrain(w, names, units)


def shards(name: str) -> int:
    """How many ways the caller's mesh and rules split logical axis `name` (1 outside them)."""
    rules = dict(spmd.get_logical_axis_rules())
    mesh = jax.sharding.get_abstract_mesh()
    if not rules or mesh.empty:
        return 1
    target = rules.get(name)
    axes = [target] if isinstance(target, str) else list(target or ())
    return math.prod(mesh.shape[a] for a in axes if a not in mesh.manual_axes)


def mesh_axes(name: str) -> tuple[str, ...]:
    """The mesh axes (larger than 1, not manual) that the caller's mesh and rules split logical
    axis `name` over; () outside them."""
    rules = dict(spmd.get_logical_axis_rules())
    mesh = jax.sharding.get_abstract_mesh()
    if not rules or mesh.empty:
        return ()
    target = rules.get(name)
    axes = [target] if isinstance(target, str) else list(target or ())
    return tuple(a for a in axes if a in mesh.shape and mesh.shape[a] > 1 and a not in mesh.manual_axes)
