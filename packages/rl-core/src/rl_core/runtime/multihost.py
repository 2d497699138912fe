"""Host data to and from global arrays, the same way on one process or many.

In a multi-process run (`jax.distributed`) every process runs the same
program on a mesh that spans all of them, and a jax.Array is global: each
process holds only the shards of its own devices. Two things then differ
from one process:
  - a jitted program takes no numpy array with a split layout, so host
    batches become global arrays with `to_global`, each process placing only
    the rows of its own devices (`jax.make_array_from_process_local_data`);
  - `jax.device_get` of an array split across processes fails, so results
    come to the host with `to_host`, which gathers them to every process.
With one process both are what `jax.device_put` and `jax.device_get` do, but that
an accelerator's small results (an update's statistics) come back as one transfer
(`fetch`). Inputs of a jitted program go through `program_inputs`: `to_global` on several
processes, and on one the host arrays themselves, which the program places faster.

Only process 0 writes the run's files (`is_primary`); the others keep in step.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Sharding


def is_primary() -> bool:
    """True on the process that writes metrics, samples, reports and file bookkeeping."""
    return jax.process_index() == 0


def multi_process() -> bool:
    return jax.process_count() > 1


def sync(name: str) -> None:
    """Wait until every process reaches the barrier `name` (nothing to wait for on one process)."""
    if multi_process():
        multihost_utils.sync_global_devices(name)


def to_global(tree: Any, sharding: Sharding) -> Any:
    """Host arrays (the same global value on every process) laid out by `sharding`; each
    process places only its own devices' shards, cut from the global value, so any order
    of the mesh's devices works (a process's shards need not be one block: JAX's device
    order for a TPU slice interleaves hosts). jax.Arrays are re-laid out by `jax.device_put`."""

    def one(x: Any) -> Any:
        if x is None:
            return None
        if isinstance(x, jax.Array) and not (multi_process() and x.is_fully_addressable):
            return jax.device_put(x, sharding)
        x = np.asarray(x)  # a process's own array (e.g. a PRNG key) holds the global value
        if not multi_process():
            return jax.device_put(x, sharding)
        return jax.make_array_from_callback(x.shape, sharding, lambda index: x[index])

    return jax.tree.map(one, tree, is_leaf=lambda x: x is None)


def program_inputs(tree: Any, sharding: Sharding) -> Any:
    """`tree` ready for a jitted program that takes it in `sharding` (its in_shardings).

    On one process host arrays stay as they are: the program's own dispatch places them in
    microseconds, where `jax.device_put` takes about 0.1 ms a leaf (a few ms for a training
    mini-batch's fields, on the host thread, while a small CPU step waits). jax.Arrays are
    re-laid out by `jax.device_put` where their layout differs (a program refuses a committed
    array in another one). On several processes it is `to_global`."""
    if multi_process():
        return to_global(tree, sharding)

    def one(x: Any) -> Any:
        if isinstance(x, jax.Array) and not x.sharding.is_equivalent_to(sharding, x.ndim):
            return jax.device_put(x, sharding)
        return x

    return jax.tree.map(one, tree)


def to_host(tree: Any) -> Any:
    """Numpy copies of the whole of every array, on every process (`fetch` on one)."""
    if not multi_process():
        return fetch(tree)

    def one(x: Any) -> Any:
        if not isinstance(x, jax.Array) or x.is_fully_addressable or x.is_fully_replicated:
            return jax.device_get(x)
        return np.asarray(multihost_utils.process_allgather(x, tiled=True))

    return jax.tree.map(one, tree)


PACKED_ELEMENTS = 4096
"""A leaf of at most this many elements comes to the host packed with the other small ones (an
update's statistics, a small rollout's tokens). Each set of shapes compiles its packing program
once: a run's shapes settle after its first steps."""


def fetch(tree: Any, *, pack: bool | None = None) -> Any:
    """`jax.device_get(tree)`, with its small numeric arrays concatenated on the device first (one
    program, a vector per dtype) and sent as one transfer. Each transfer from an accelerator pays a
    fixed latency, and an update's statistics are ~30 scalars a step. `pack` defaults to arrays
    off the CPU, whose transfers are copies in memory (and where packing would add a program)."""
    leaves, treedef = jax.tree.flatten(tree)
    small = [i for i, x in enumerate(leaves) if _packable(x)]
    if pack is None:
        pack = bool(small) and next(iter(leaves[small[0]].devices())).platform != "cpu"
    if not pack or len(small) < 2:
        return jax.device_get(tree)
    groups: dict[Any, list[int]] = {}  # one program per set of devices: a program takes one
    for i in small:
        groups.setdefault(frozenset(leaves[i].sharding.device_set), []).append(i)
    packed = [_concatenated(tuple(leaves[i] for i in ids)) for ids in groups.values()]
    taken = set(small)
    rest, packed = jax.device_get(([None if i in taken else x for i, x in enumerate(leaves)], packed))
    for ids, vectors in zip(groups.values(), packed):
        offsets = dict.fromkeys(vectors, 0)
        for i in ids:
            key, n = leaves[i].dtype.str, leaves[i].size
            rest[i] = vectors[key][offsets[key]: offsets[key] + n].reshape(leaves[i].shape)
            offsets[key] += n
    return jax.tree.unflatten(treedef, rest)


def _packable(x: Any) -> bool:
    if not isinstance(x, jax.Array) or x.size > PACKED_ELEMENTS or not x.is_fully_addressable:
        return False
    return isinstance(x.dtype, np.dtype) and x.dtype.kind in "biufc"  # not a PRNG key, nor bfloat16 ("V")


@jax.jit
def _concatenated(arrays: tuple[jax.Array, ...]) -> dict[str, jax.Array]:
    by_dtype: dict[str, list[jax.Array]] = {}
    for x in arrays:
        by_dtype.setdefault(x.dtype.str, []).append(x.ravel())
    return {key: jnp.concatenate(xs) for key, xs in by_dtype.items()}


def gather_rows(local: np.ndarray, counts: Sequence[int]) -> np.ndarray:
    """Rows from every process in process order, process p giving `counts[p]` rows (`local`)."""
    if not multi_process():
        return np.asarray(local)
    local = np.asarray(local)
    if len(local) != counts[jax.process_index()]:
        raise ValueError(f"process {jax.process_index()} has {len(local)} rows, expected {counts[jax.process_index()]}")
    padded = np.zeros((max(counts), *local.shape[1:]), local.dtype)  # one shape on every process
    padded[: len(local)] = local
    every = np.asarray(multihost_utils.process_allgather(padded))  # [processes, max(counts), ...]
    return np.concatenate([every[p, :n] for p, n in enumerate(counts)])


def split_counts(n: int, parts: int | None = None) -> list[int]:
    """`n` items in `parts` (default: the processes) contiguous blocks, sizes differing by at most one."""
    parts = jax.process_count() if parts is None else parts
    return [n // parts + (p < n % parts) for p in range(parts)]


def own_block(n: int) -> slice:
    """This process's block of `n` items under `split_counts`."""
    counts = split_counts(n)
    start = sum(counts[: jax.process_index()])
    return slice(start, start + counts[jax.process_index()])
