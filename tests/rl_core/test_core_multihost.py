"""rl_core.multihost on one process: the same as device_put / device_get, and the block arithmetic
that a multi-process run relies on (the processes themselves: tests/trainer/test_trainer_multihost.py)."""

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from rl_core import multihost


class FakeSharding:
    """What `local_slices` reads of a sharding: this process's devices' index blocks."""

    def __init__(self, blocks):
        self.blocks = blocks

    def addressable_devices_indices_map(self, shape):
        return {i: block for i, block in enumerate(self.blocks)}


def test_split_counts_and_own_block_give_contiguous_near_equal_blocks():
    assert multihost.split_counts(5, 2) == [3, 2]  # process 0 takes the extra group
    assert multihost.split_counts(8, 4) == [2, 2, 2, 2]
    assert multihost.split_counts(1, 3) == [1, 0, 0]
    assert multihost.own_block(6) == slice(0, 6)  # one process: everything


def test_local_slices_is_the_block_of_this_processs_devices():
    # process 1 of 2 holding rows 4..8 of 8 on two devices, columns whole
    rows = FakeSharding([(slice(4, 6), slice(None)), (slice(6, 8), slice(None))])
    assert multihost.local_slices(rows, (8, 3)) == (slice(4, 8), slice(0, 3))
    # replicas (e.g. over tensor) cover the same rows twice: still one block
    replicas = FakeSharding([(slice(0, 4), slice(None)), (slice(0, 4), slice(None))])
    assert multihost.local_slices(replicas, (8, 3)) == (slice(0, 4), slice(0, 3))


def test_local_slices_refuses_rows_scattered_among_another_processs():
    scattered = FakeSharding([(slice(0, 2),), (slice(4, 6),)])  # rows 2..4 belong to another process
    with pytest.raises(ValueError, match=r"not one block"):
        multihost.local_slices(scattered, (8,))


def test_one_process_round_trip_equals_device_put_and_get():
    mesh = jax.make_mesh((1,), ("x",))
    rows = NamedSharding(mesh, P("x"))
    host = {"a": np.arange(6, dtype=np.int32).reshape(3, 2), "b": None}
    placed = multihost.to_global(host, rows)
    assert placed["b"] is None and placed["a"].sharding == rows
    back = multihost.to_host(placed)
    np.testing.assert_array_equal(back["a"], host["a"])
    np.testing.assert_array_equal(multihost.gather_rows(np.array([1.5, 2.5]), [2]), [1.5, 2.5])
    assert multihost.is_primary() and not multihost.multi_process()
    multihost.sync("nothing to wait for")
