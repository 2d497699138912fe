"""Threefry lowered without a loop on CPU: the same random bits from fewer operations.

Every `jax.random` draw and key split evaluates the Threefry-2x32 hash. On CPU, JAX
lowers it as a 5-iteration `while` loop over the 20 rounds (smaller programs to
compile); on GPU and TPU as straight-line code. XLA:CPU runs each loop iteration as
a dozen separate scalar-sized operations, so one draw costs about a hundred
dispatches, and the sampler draws twice per decoded token (a key split, then the
token). `unroll_threefry_on_cpu()` gives CPU the straight-line form as well: the same
bits, one fusion per draw, the tiny-qwen2 rollout 5-7% faster (interleaved A/B).

A process-wide setting (a lowering rule, read when a program is traced), so
applications call it at start-up, as they call `rl_core.runtime.host_memory.keep_freed_memory`:
the trainer's command line, the test suite, the benchmarks. Importing rl_core never does.
"""

from __future__ import annotations

import jax
import numpy as np
from jax.extend.random import threefry2x32_p
from jax.interpreters import mlir

_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))
_PARITY = np.uint32(0x1BD11BDA)  # Threefry's key schedule constant


def _rotate_left(x: jax.Array, r: int) -> jax.Array:
    return jax.lax.shift_left(x, np.uint32(r)) | jax.lax.shift_right_logical(x, np.uint32(32 - r))


def threefry2x32(key1: jax.Array, key2: jax.Array, x1: jax.Array, x2: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Threefry-2x32 with 20 rounds (Salmon et al., 2011) on uint32 arrays, as straight-line code."""
    ks = (key1, key2, key1 ^ key2 ^ _PARITY)
    x1, x2 = x1 + ks[0], x2 + ks[1]
    for i in range(5):  # 5 groups of 4 rounds, a key injection after each
        for r in _ROTATIONS[i % 2]:
            x1 = x1 + x2
            x2 = _rotate_left(x2, r) ^ x1
        x1 = x1 + ks[(i + 1) % 3]
        x2 = x2 + ks[(i + 2) % 3] + np.uint32(i + 1)
    return x1, x2


def unroll_threefry_on_cpu() -> None:
    """Lower `jax.random`'s hash on CPU as `threefry2x32` (no loop); call before tracing."""
    mlir.register_lowering(threefry2x32_p, mlir.lower_fun(threefry2x32, multiple_results=True), platform="cpu")
