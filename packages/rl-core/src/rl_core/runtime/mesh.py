"""The device mesh and the one table that places every array on it.

The mesh has four named axes:
  data    pure data parallelism: rows split, parameters replicated;
  fsdp    rows split and parameters (and optimizer state) sharded on their embed axis;
  expert  a mixture of experts' experts split (rl_models.moe sends each token to its experts'
          devices and back with all-to-alls); outside the experts it is one more fsdp axis: rows
          split and the other weights sharded on their embed axis;
  tensor  attention heads and the MLP's inner width split (Megatron-style).

A model names the axes of its parameters logically (`nnx.Param(...,
out_sharding=("embed", "mlp"))`, see rl_models); `RULES` maps those names to
mesh axes. A dimension the mapped mesh axes do not divide is left whole, and a
mesh axis is used at most once per array (first come, first served), so any
model runs on any mesh; the split is just coarser. Activations are named too
(act_batch, act_embed, ...); `activation_layout` applies the same table to them
while a program is traced.
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import numpy as np
from flax import nnx
from flax.core import spmd
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from rl_core.config import ConfigError, MeshConfig, TrainingConfig

MESH_AXES = ("data", "fsdp", "expert", "tensor")
BATCH = ("data", "fsdp", "expert")
"""Mesh axes the rows of a batch are split over."""

MeshAxes = str | tuple[str, ...] | None

RULES: dict[str, MeshAxes] = {
    "batch": BATCH,
    "vocab": "tensor",
    "embed": ("fsdp", "expert"),  # an expert weight takes `expert` on its experts axis first
    "heads": "tensor",
    "kv_heads": "tensor",
    "kv_lanes": "tensor",  # a lane-packed cache's K x Dh (rl_models.block.LaneKV), in whole 128-lane groups
    "mlp": "tensor",
    "head_dim": None,
    "norm": None,
    "layers": None,
    "cache_slots": None,
    "experts": "expert",  # a mixture's experts (rl_models.moe), each device holding E / expert of them
    # activations (rl_models.sharding): rows split like the batch, features like their weights'
    # tensor-parallel axis, never over fsdp (FSDP gathers weights, not activations)
    "act_batch": BATCH,
    "act_length": None,
    "act_embed": None,
    "act_heads": "tensor",
    "act_kv_heads": "tensor",
    "act_mlp": "tensor",
    "act_vocab": "tensor",
    "act_experts": "expert",  # expert weights stay split over experts where they are used
}
"""Logical axis name -> mesh axes (None: never split)."""

UNITS: dict[str, int] = {"kv_lanes": 128}
"""Logical axis name -> the multiple it splits in (default 1): a lane-packed cache's heads sit side by
side in groups of a TPU vector's 128 lanes, and each device keeps whole groups (else the cache stays
whole on the tensor axis, as KV heads the devices do not divide do)."""


def make_mesh(data: int = 1, fsdp: int = -1, tensor: int = 1, devices: Sequence[jax.Device] | None = None, *,
              expert: int = 1) -> Mesh:
    """A (data, fsdp, expert, tensor) mesh over `devices` (default: every device of every process);
    one size may be -1 (the remaining devices).

    `jax.make_mesh` orders devices so that the innermost axis (tensor) gets the
    best-connected ones on accelerators.
    """
    devices = list(devices if devices is not None else jax.devices())
    shape = MeshConfig(data=data, fsdp=fsdp, tensor=tensor, expert=expert).shape(len(devices))
    # Auto axes: XLA's partitioner propagates layouts from the stated ones (no sharding in types)
    auto = (AxisType.Auto,) * len(MESH_AXES)
    if len(devices) == jax.device_count():
        return jax.make_mesh(shape, MESH_AXES, devices=devices, axis_types=auto)
    return Mesh(np.array(devices).reshape(shape), MESH_AXES, axis_types=auto)


def data_mesh(devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A mesh of pure data parallelism over `devices` (default: all): parameters replicated."""
    return make_mesh(data=-1, fsdp=1, tensor=1, devices=devices)


def training_devices(training: TrainingConfig) -> list[jax.Device]:
    """The devices `training.mesh` is laid over: all but the last `training.rollout_devices`."""
    devices = jax.devices()
    n = training.rollout_devices
    if n and jax.process_count() > 1:
        raise ConfigError(f"training.rollout_devices = {n}: a multi-process run cannot set devices apart for "
                          "rollouts yet (its processes run the collection in line); use 0")
    if n >= len(devices):
        raise ConfigError(f"training.rollout_devices = {n}: must leave devices to train on ({len(devices)} in all)")
    return devices[: len(devices) - n]


def training_mesh(training: TrainingConfig) -> Mesh:
    """The run's training mesh, from `training.mesh` over `training_devices`."""
    return make_mesh(**training.mesh.to_dict(), devices=training_devices(training))


def rollout_mesh(training: TrainingConfig, mesh: Mesh) -> Mesh | None:
    """The mesh of the devices set apart for rollouts (fsdp over the last `rollout_devices`
    devices outside `mesh`), or None when rollouts share the training devices."""
    n = training.rollout_devices
    if not n:
        return None
    taken = set(mesh.devices.flat)
    free = [d for d in jax.devices() if d not in taken]
    if len(free) < n:
        raise ConfigError(f"training.rollout_devices = {n}: only {len(free)} devices are outside the training mesh")
    return make_mesh(data=1, fsdp=-1, tensor=1, devices=free[-n:])


def logical_spec(names: Sequence[str | None], shape: Sequence[int], mesh: Mesh,
                 rules: dict[str, MeshAxes] = RULES, units: Sequence[int] | None = None) -> P:
    """The PartitionSpec of an array with logical axis `names` and `shape` on `mesh`.

    `units[i]`: dimension i splits only in whole multiples of it (a fused heads x
    head_dim axis has unit head_dim, so each device gets whole heads); by default each name's `UNITS`.
    """
    if len(names) != len(shape):
        raise ValueError(f"logical axes {tuple(names)} do not match shape {tuple(shape)}")
    units = tuple(units) if units is not None else tuple(UNITS.get(n, 1) if n else 1 for n in names)
    if len(units) != len(shape) or any(u < 1 or size % u for u, size in zip(units, shape, strict=True)):
        raise ValueError(f"axis units {units} do not divide shape {tuple(shape)}")
    used: set[str] = set()
    spec: list[MeshAxes] = []
    for name, size, unit in zip(names, shape, units, strict=True):
        if name is not None and name not in rules:
            raise ValueError(f"no sharding rule for logical axis {name!r}; known: {sorted(rules)}")
        target = rules.get(name) if name is not None else None
        axes = [target] if isinstance(target, str) else list(target or ())
        axes = [a for a in axes if a not in used and mesh.shape[a] > 1]
        while axes and (size // unit) % math.prod(mesh.shape[a] for a in axes):
            axes.pop()  # a dimension the devices do not divide stays (partly) whole
        used.update(axes)
        spec.append(None if not axes else axes[0] if len(axes) == 1 else tuple(axes))
    return P(*spec)


def logical_sharding(names: Sequence[str | None], shape: Sequence[int], mesh: Mesh,
                     units: Sequence[int] | None = None) -> NamedSharding:
    return NamedSharding(mesh, logical_spec(names, shape, mesh, units=units))


def param_shardings(params: nnx.State, mesh: Mesh) -> nnx.State:
    """A tree like `params` (concrete or abstract nnx Variables) of NamedShardings
    from each Variable's logical `out_sharding` names and `axis_units` (whole heads);
    unnamed ones are replicated."""

    def one(var: nnx.Variable) -> nnx.Variable:
        names = var.get_metadata("out_sharding", None) or (None,) * len(var.shape)
        units = var.get_metadata("axis_units", None)
        return var.replace(logical_sharding(names, var.shape, mesh, units))

    return jax.tree.map(one, params, is_leaf=lambda x: isinstance(x, nnx.Variable))


def rows(mesh: Mesh, axis: int = 0) -> NamedSharding:
    """Axis `axis` (the rows) split over (data, fsdp, expert); every other axis whole."""
    return NamedSharding(mesh, P(*([None] * axis), BATCH))


def batch_devices(mesh: Mesh) -> int:
    """How many ways the rows of a batch are split."""
    return math.prod(mesh.shape[a] for a in BATCH)


def traced_row_shards() -> int:
    """How many ways rows are split in the activation layout being traced (1 outside one)."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return 1
    return math.prod(mesh.shape[a] for a in BATCH if a in mesh.shape and a not in mesh.manual_axes)


def traced_layout(x: jax.Array, names: Sequence[str | None]) -> jax.Array:
    """`x` constrained to the layout of logical axis `names` (`RULES`) in the activation layout
    being traced; the identity outside one (or inside a shard_map)."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or mesh.manual_axes:
        return x
    return jax.lax.with_sharding_constraint(x, logical_spec(names, x.shape, mesh))


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P())


@contextlib.contextmanager
def activation_layout(mesh: Mesh | None) -> Iterator[None]:
    """Within it, a traced model's named activations (rl_models.sharding.constrain) are laid
    out on `mesh` by `RULES`; enter it inside the traced function (see `with_activation_layout`)."""
    if mesh is None or mesh.size == 1:
        yield
        return
    with jax.sharding.use_abstract_mesh(mesh.abstract_mesh), spmd.logical_axis_rules(tuple(RULES.items())):
        yield


def with_activation_layout(mesh: Mesh | None, fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn` tracing under `activation_layout(mesh)`: what to hand `jax.jit`."""

    @functools.wraps(fn)
    def traced(*args: Any, **kwargs: Any) -> Any:
        with activation_layout(mesh):
            return fn(*args, **kwargs)

    return traced
