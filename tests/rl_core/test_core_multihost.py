"""rl_core.runtime.multihost on one process: the same as device_put / device_get, and the block arithmetic
that a multi-process run relies on (the processes themselves: tests/trainer/test_trainer_multihost.py
and tests/algos/test_algo_interleaved_processes.py)."""

import jax
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from rl_core.runtime import multihost


def test_split_counts_and_own_block_give_contiguous_near_equal_blocks():
    assert multihost.split_counts(5, 2) == [3, 2]  # process 0 takes the extra group
    assert multihost.split_counts(8, 4) == [2, 2, 2, 2]
    assert multihost.split_counts(1, 3) == [1, 0, 0]
    assert multihost.own_block(6) == slice(0, 6)  # one process: everything


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


def test_one_process_program_inputs_leave_host_arrays_to_the_program():
    mesh = jax.make_mesh((1,), ("x",))
    rows = NamedSharding(mesh, P("x"))
    host = {"a": np.arange(6, dtype=np.int32).reshape(3, 2), "b": None}
    placed = multihost.to_global(host, rows)
    inputs = multihost.program_inputs({**host, "c": placed["a"]}, rows)
    # host arrays and arrays already in the layout come back as they are: the program places them
    assert inputs["a"] is host["a"] and inputs["b"] is None and inputs["c"] is placed["a"]
    program = jax.jit(lambda t: t["a"] * 2 + t["c"], in_shardings=(rows,), out_shardings=rows)
    np.testing.assert_array_equal(program(inputs), program(placed | {"c": placed["a"]}))
    np.testing.assert_array_equal(program(inputs), host["a"] * 3)


def test_fetch_packs_small_arrays_into_one_transfer_and_gives_device_gets_values():
    devices = jax.devices()[:2]
    mesh = jax.make_mesh((len(devices),), ("x",), devices=devices)
    on_mesh = jax.device_put(np.arange(8, dtype=np.float32), NamedSharding(mesh, P("x")))
    tree = {
        "loss": jax.numpy.float32(0.25), "finite": jax.numpy.bool_(True), "count": jax.numpy.int32(7),
        "means": {"kl": jax.numpy.array([1.5, 4.0])}, "key": jax.random.key(0), "host": np.ones(3),
        "big": jax.numpy.arange(multihost.PACKED_ELEMENTS + 1), "none": None, "on_mesh": on_mesh,
        "other_device": jax.device_put(jax.numpy.array([3, 1], jax.numpy.int8), devices[-1]),
        "bf16": jax.numpy.array([0.5, 1.5], jax.numpy.bfloat16),
    }
    fetched = multihost.fetch({k: v for k, v in tree.items() if k != "key"}, pack=True)
    expected = jax.device_get({k: v for k, v in tree.items() if k != "key"})
    assert jax.tree.structure(fetched) == jax.tree.structure(expected)
    for got, want in zip(jax.tree.leaves(fetched), jax.tree.leaves(expected), strict=True):
        assert isinstance(got, np.ndarray) and got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got, want)
    assert fetched["loss"] == np.float32(0.25) and fetched["finite"] and fetched["count"] == 7
    np.testing.assert_array_equal(fetched["means"]["kl"], [1.5, 4.0])
    # a key array is not numeric: it stays out of the pack (and device_get takes it as ever)
    assert not multihost._packable(tree["key"]) and multihost._packable(tree["loss"])
    assert not multihost._packable(tree["big"]) and not multihost._packable(tree["host"])
    # on the CPU the default is device_get itself: no packing program
    assert multihost.fetch({"a": jax.numpy.float32(1.0), "b": jax.numpy.float32(2.0)}) == {"a": 1.0, "b": 2.0}
