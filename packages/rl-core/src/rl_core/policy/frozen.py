"""Which of a model's parameters train and which stay frozen.

A model with adapters (`nnx.LoRAParam`, e.g. rl_models.lora) trains only them, plus
any parameter marked `train_with_adapters=True` in its metadata (a value head over a
shared frozen base, rl_models.value): every other `nnx.Param` is the frozen base,
placed once on the mesh, never copied, never donated and never in the optimizer. A
model without adapters trains every Param and freezes nothing. Parameters travel as
plain nested dicts of arrays (`nnx.to_pure_dict`); `join` puts the two halves back
into one tree.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
from flax import nnx

TRAIN_WITH_ADAPTERS = "train_with_adapters"
"""Metadata key of a Param that trains even when the rest of the model is a frozen base."""


def trained_with_adapters(path: Any, value: Any) -> bool:
    """An nnx filter: adapters, and Params marked to train beside them."""
    del path
    return isinstance(value, nnx.LoRAParam) or (
        isinstance(value, nnx.Param) and bool(value.get_metadata(TRAIN_WITH_ADAPTERS, False))
    )


def split_policy(policy: nnx.Module) -> tuple[nnx.GraphDef, nnx.State, nnx.State, nnx.State]:
    """(graphdef, trained, frozen, rest) of `policy`; `rest` is state that is no Param."""
    if jax.tree.leaves(nnx.state(policy, nnx.LoRAParam)):
        return nnx.split(policy, trained_with_adapters, nnx.Param, ...)
    graphdef, trained, rest = nnx.split(policy, nnx.Param, ...)
    return graphdef, trained, nnx.State({}), rest


def join(trained: Mapping[str, Any], frozen: Mapping[str, Any]) -> dict[str, Any]:
    """One nested dict holding the leaves of both (their key paths never collide)."""
    out = dict(trained)
    for key, value in frozen.items():
        if key in out and isinstance(value, Mapping):
            out[key] = join(out[key], value)
        elif key in out:
            raise ValueError(f"parameter {key!r} is both trained and frozen")
        else:
            out[key] = value
    return out
