"""Weights by version as one safetensors snapshot: what the learner publishes and a server loads.

A snapshot holds every leaf of the policy's whole parameter tree under its path ("layers/attn/
k_proj/bias"), so a server fills the tree it was started with, whatever container types the
trainer's tree uses (nnx.State, plain dicts). It is written once per version through fsspec
(a local folder, or any URL fsspec opens that every server reads too).
"""

from __future__ import annotations

from typing import Any

import fsspec
import jax
import numpy as np
from flax import nnx
from safetensors.numpy import load as load_bytes
from safetensors.numpy import save as save_bytes


def _name(path: tuple[Any, ...]) -> str:
    parts = []
    for entry in path:
        if isinstance(entry, jax.tree_util.GetAttrKey) and entry.name == "value":
            continue  # an nnx Variable's payload: the same leaf as in a plain dict
        parts.append(str(getattr(entry, "key", getattr(entry, "idx", getattr(entry, "name", entry)))))
    return "/".join(parts)


def flat(tree: Any) -> dict[str, np.ndarray]:
    """Every leaf of `tree` on the host, by its path."""
    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    return {_name(path): np.asarray(jax.device_get(leaf)) for path, leaf in leaves}


def snapshot(tree: Any) -> bytes:
    """`tree` as the bytes of one safetensors file."""
    return save_bytes(flat(tree))


def write(tree: Any, url: str) -> int:
    """Write `tree` to `url` as one safetensors file; its size in bytes."""
    data = snapshot(tree)
    with fsspec.open(url, "wb") as f:
        f.write(data)
    return len(data)


def parse(data: bytes) -> dict[str, np.ndarray]:
    """A snapshot's bytes (streamed to a server) as leaves by path."""
    return load_bytes(data)


def read(url: str) -> dict[str, np.ndarray]:
    with fsspec.open(url, "rb") as f:
        return load_bytes(f.read())


def fill(template: nnx.State, weights: dict[str, np.ndarray]) -> nnx.State:
    """`template` (the server's own tree) with every leaf taken from `weights`; a missing or extra
    leaf, or one of another shape, is a ValueError naming it."""
    pure = nnx.to_pure_dict(template)
    leaves, treedef = jax.tree_util.tree_flatten_with_path(pure)
    names = [_name(path) for path, _ in leaves]
    missing, extra = sorted(set(names) - set(weights)), sorted(set(weights) - set(names))
    if missing or extra:
        raise ValueError(f"the weights do not fit the served model: missing {missing[:3]}, extra {extra[:3]}")
    for (_, old), name in zip(leaves, names, strict=True):
        if tuple(old.shape) != weights[name].shape:
            raise ValueError(f"weight {name!r} has shape {weights[name].shape}; the served model's is {old.shape}")
    new = jax.tree_util.tree_unflatten(treedef, [weights[name] for name in names])
    nnx.replace_by_pure_dict(template, new)
    return template
