"""The paged engine's inference weights with each layer's parameters as arrays of their own.

A model whose layers run unrolled (rl_models on CPU) reads layer i's weights as slices of
its [layers, ...] stacks, and a program that slices a stack it is given copies it. The
engine's step program runs every `steps_per_sync` tokens, so it copied every weight once
per call (SmolLM2-135M, float32: 538 MB every 8 tokens). The engine instead slices the
stacks once per weight version, in its refresh (`unstack`), keeps one array per layer, and
its step rebuilds the stacks from them (`restack`): XLA folds layer i's slice of the
rebuilt stack to layer i's array, so a call reads the weights where they are.
Which top-level entries are such stacks, the adapter says (`PagedModel`'s optional `loop_stacks`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P


def _is_layers(x: Any) -> bool:
    return isinstance(x, list)


def unstack(weights: dict, stacks: Sequence[str]) -> dict:
    """`weights` (a pure dict) with each leaf under the entries `stacks` split on its leading
    (layer) axis into a list of one array per layer."""
    out = dict(weights)
    for name in stacks:
        out[name] = jax.tree.map(lambda a: [a[i] for i in range(a.shape[0])], weights[name])
    return out


def restack(weights: dict, stacks: Sequence[str]) -> dict:
    """`unstack`'s inverse (traced inside the program that runs the model, where it folds away)."""
    out = dict(weights)
    for name in stacks:
        out[name] = jax.tree.map(jnp.stack, weights[name], is_leaf=_is_layers)
    return out


def unstack_shardings(shardings: dict, abstract: dict, stacks: Sequence[str]) -> dict:
    """The NamedShardings of `unstack(weights)` from those of `weights` (`abstract`: its shapes):
    each layer's array is laid out as its stack without the layer axis, which must be unsplit."""

    def per_layer(a: Any, s: NamedSharding) -> list[NamedSharding]:
        if len(s.spec) and s.spec[0] is not None:
            raise ValueError(f"a stacked weight split over {s.spec[0]!r} on its layer axis cannot be unstacked")
        return [NamedSharding(s.mesh, P(*s.spec[1:]))] * a.shape[0]

    out = dict(shardings)
    for name in stacks:
        out[name] = jax.tree.map(per_layer, abstract[name], shardings[name])
    return out
