"""unroll_threefry_on_cpu(): jax.random's bits unchanged, and no loop left in a draw's program."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.extend.random import threefry_2x32
from rl_core.runtime.cpu_random import threefry2x32, unroll_threefry_on_cpu
from host import about_the_cpu

U32_MAX = np.iinfo(np.uint32).max
# Threefry-2x32-20 known answers from the reference implementation (Random123):
# (key, counter) -> output
KNOWN_ANSWERS = [
    ((0, 0), (0, 0), (0x6B200159, 0x99BA4EFE)),
    ((U32_MAX, U32_MAX), (U32_MAX, U32_MAX), (0x1CB996FC, 0xBB002BE7)),
    ((0x13198A2E, 0x03707344), (0x243F6A88, 0x85A308D3), (0xC4923A9C, 0x483DF7A0)),
]


@pytest.mark.parametrize(("key", "counter", "expected"), KNOWN_ANSWERS)
def test_hash_gives_the_reference_answers(key, counter, expected):
    key, counter = np.uint32(key), np.uint32(counter)
    out = jax.jit(threefry2x32)(key[0], key[1], counter[0], counter[1])
    assert tuple(int(x) for x in out) == expected
    unroll_threefry_on_cpu()  # the suite has already (tests/conftest.py); idempotent
    assert tuple(int(x) for x in threefry_2x32(key, counter)) == expected  # jax's own entry point


def test_draws_equal_jax_loop_lowering():
    """Values recorded with JAX's default CPU lowering (the 5-iteration loop), jax 0.10.2."""
    unroll_threefry_on_cpu()
    key = jax.random.PRNGKey(7)
    np.testing.assert_array_equal(
        jax.random.split(key, 3).ravel(), [3625411723, 1954958720, 195045567, 4062205631, 966301609, 1948237315]
    )
    np.testing.assert_array_equal(
        jax.random.bits(key, (5,)), [2895194379, 4185947648, 1300703658, 1906787632, 3139134342]
    )
    np.testing.assert_array_equal(jax.random.categorical(key, jnp.zeros((4, 10))), [1, 9, 0, 0])


@about_the_cpu("the unrolled threefry is XLA:CPU's lowering (rl_core.runtime.cpu_random)")
def test_a_draw_compiles_without_a_loop():
    unroll_threefry_on_cpu()
    key = jax.random.PRNGKey(0)
    text = jax.jit(lambda k: jax.random.uniform(jax.random.split(k)[1], (3, 7))).lower(key).compile().as_text()
    assert " while(" not in text
