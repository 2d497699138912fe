"""What a mixture of experts adds to `trainer plan`: its expert weights and their optimizer state
(split over the mesh's `expert` axis, and over fsdp / tensor like any weight), the buffers that
carry a micro-batch's tokens to their experts and back (rl_models.moe), and the expert weights
FSDP gathers for a layer where the expert axis does not split them.

Per device, for one MoE layer of a micro-batch: n tokens on the device (its rows x the sequence
length), m = n * k (token, expert) pairs, ep the expert axis (1 when it does not divide E):
  ep = 1  the pairs sorted by expert and their outputs: 2 * m * D values;
  ep > 1  besides those, the send, received, result and returned buffers of the two all-to-alls,
          each ep slots of m rows (a device may send all its pairs to one other; nothing is
          dropped): 4 * ep * m * D values;
and the experts' inner activations (gate, up, their product) for the rows it runs: 3 * rows * F /
tensor. Gathered weights: the E / ep experts a device runs, whole over fsdp (split over tensor),
three kernels of D x F.
"""

from __future__ import annotations

from typing import Any

import jax
from flax import nnx


def expert_paths(abstract: nnx.State) -> set[tuple[str, ...]]:
    """The paths of the parameters with an `experts` logical axis."""
    return {tuple(map(str, path)) for path, v in nnx.to_flat_state(abstract)
            if "experts" in (v.get_metadata("out_sharding", None) or ())}


def expert_bytes(tree: Any, paths: set[tuple[str, ...]], per_device) -> int:
    """Per-device bytes of the leaves of `tree` whose key path ends with one of `paths` (so an
    optimizer state's moments of the expert weights count too)."""
    leaves = [x for path, x in jax.tree_util.tree_flatten_with_path(tree)[0]
              if any(_keys(path)[-len(p):] == p for p in paths)]
    return per_device(leaves)


def _keys(path: tuple) -> tuple[str, ...]:
    return tuple(str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))) for k in path)


def expert_axis(config: Any, mesh: Any) -> int:
    """How many ways the mesh splits the experts (1 where its `expert` axis does not divide E)."""
    ep = mesh.shape.get("expert", 1)
    return ep if config.num_experts % ep == 0 else 1


def dispatch_bytes(config: Any, mesh: Any, tokens_per_device: int) -> int:
    """One MoE layer's dispatch buffers and inner activations per device (module docstring)."""
    ep, tensor = expert_axis(config, mesh), mesh.shape["tensor"]
    size = jax.numpy.dtype(config.dtype).itemsize
    m = tokens_per_device * config.experts_per_token
    rows = ep * m if ep > 1 else m
    moved = (2 * m + (4 * ep * m if ep > 1 else 0)) * config.hidden_size
    return (moved + 3 * rows * config.moe_hidden_size // tensor) * size


def gathered_expert_bytes(config: Any, mesh: Any) -> int:
    """One layer's expert kernels as a device runs them: its E / ep experts whole over fsdp."""
    ep, tensor = expert_axis(config, mesh), mesh.shape["tensor"]
    size = jax.numpy.dtype(config.dtype).itemsize
    return 3 * (config.num_experts // ep) * config.hidden_size * config.moe_hidden_size // tensor * size


def expert_rows(config: Any, mesh: Any, abstract: nnx.State, params: Any, opt_state: Any, tokens_per_device: int,
                per_device) -> dict[str, int]:
    """The plan's analytic rows for a mixture of experts (empty for a dense model)."""
    if not config.num_experts:
        return {}
    paths = expert_paths(abstract)
    return {
        "expert_parameters": expert_bytes(params, paths, per_device),
        "expert_optimizer_state": expert_bytes(opt_state, paths, per_device),
        "dispatch_buffers": dispatch_bytes(config, mesh, tokens_per_device),
        "gathered_expert_weights": gathered_expert_bytes(config, mesh),
    }


def expert_layouts(experts: int, shape: tuple[int, int, int, int]) -> list[tuple[str, ...]]:
    """Meshes with an expert axis to search, as overrides: the fsdp devices split into expert x
    fsdp, the expert axis dividing both them and the E experts, largest first (no expert weight
    gathered at all when it takes every fsdp device). Empty when the mesh already has one."""
    data, fsdp, expert, tensor = shape
    if not experts or expert > 1:
        return []
    sizes = [e for e in range(fsdp, 1, -1) if fsdp % e == 0 and experts % e == 0]
    return [(f"training.mesh.expert={e}", f"training.mesh.fsdp={fsdp // e}") for e in sizes]
