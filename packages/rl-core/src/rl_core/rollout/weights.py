"""The weights a rollout engine samples with, when they are not the trained ones: a copy
(pinned for a collection ahead) or a cast to `rollout.weights_dtype` (the generator's own, and
what `trainer plan` traces on shapes to count the copy)."""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp


@jax.jit
def copy_tree(tree: Any) -> Any:
    """New buffers with `tree`'s values (one program; a jitted identity would alias)."""
    return jax.tree.map(lambda x: x.copy(), tree)


@functools.partial(jax.jit, static_argnums=1)
def cast_weights(tree: Any, dtype: str) -> Any:
    """`tree` with its wider floating leaves in `dtype`, new buffers; integer leaves (a quantized
    base's codes) and leaves already as narrow pass through uncopied (never donated)."""
    target = jnp.dtype(dtype)

    def cast(x: jax.Array) -> jax.Array:
        wider = jnp.issubdtype(x.dtype, jnp.floating) and x.dtype.itemsize > target.itemsize
        return x.astype(target) if wider else x

    return jax.tree.map(cast, tree)
