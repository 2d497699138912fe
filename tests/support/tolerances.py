"""How closely two computations of the same value agree, per backend and dtype: the one place a
test's tolerance follows the hardware.

A test states the bounds that hold on CPU, where the suite is developed and CI runs, and they
stay exactly as tight there (they are what catches a real bug). On another backend a bound is
raised to that backend's floor for the dtype, the agreement its arithmetic can deliver:

- TPU float32: matrix products run as bfloat16 passes by default (about 3 digits); the suite
  runs them at `highest` on an accelerator (`SUITE_MATMUL_PRECISION`, applied by
  tests/conftest.py), which gives about 7 digits, and then log, exp and tanh, which TPU computes
  by its own approximations, agree with a CPU's to 4-5 digits (a v5e, 2026-12-06: log(1.5) 6.1e-5
  off, so exp(log 1.5) = 1.5000914; a log-softmax over 10 logits 5.4e-5 relative; tanh-capped
  logits 3.2e-5): a composite (a log-softmax over the vocabulary, a ratio exp(a - b) and a loss of
  it) to about 6e-5.
- bfloat16 anywhere: 8 bits of mantissa, 2^-8 = 4e-3 a rounding, a few roundings deep.

    np.testing.assert_allclose(got, want, **close(rtol=1e-6, atol=1e-6))
    assert loss == approx(0.25, abs=1e-6)
    assert gap < bound(1e-5)
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import pytest

from host import backend

SUITE_MATMUL_PRECISION = {"cpu": None, "tpu": "highest", "gpu": "highest"}
"""`jax_default_matmul_precision` for the suite, per backend: on CPU float32 products are float32
already (None: JAX's default); on an accelerator the fast tier checks the math, so float32 products
run at full float32 precision (the faster default passes are a speed setting, which
`trainer bench` measures)."""

FLOORS: dict[tuple[str, str], float] = {
    ("cpu", "float32"): 0.0,
    ("cpu", "bfloat16"): 0.0,
    ("tpu", "float32"): 1e-4,
    ("tpu", "bfloat16"): 2e-2,
}
"""(backend, dtype) -> the least rtol and atol a comparison gets there. CPU: none (the test's own
bounds). A backend or dtype not listed gets the loosest floor listed for the dtype (GPU float32 is
not measured: at `highest` it is IEEE float32, within the TPU's)."""


DEEPER_FLOORS: dict[str, dict[tuple[str, str], float]] = {
    # a whole model's logits against transformers' (or another program's), on a v5e (2026-12-06):
    # gemma2 (tanh softcaps at two depths) 1.5e-4 off, qwen3.5's gated delta rule (exp of summed
    # log-decays) 5.7e-4, qwen3.5-MoE 7.5e-4, gemma4_text's packed rows 8.2e-4; the others within 1e-4
    "model logits": {("cpu", "float32"): 0.0, ("tpu", "float32"): 1.5e-3},
    # Splash's dq, dk, dv (its blockwise softmax, recomputed in the kernel's order) against XLA's
    # attention: 7.1e-5 off on a v5e (2026-12-06)
    "kernel gradients": {("cpu", "float32"): 0.0, ("tpu", "float32"): 1.5e-4},
}
"""Floors of comparisons deeper than one composite (`close(..., of=KIND)`): twice what was measured."""


def floor(dtype: Any = jnp.float32, on: str | None = None, of: str | None = None) -> float:
    """The floor for `dtype` on backend `on` (default: this process's backend), of a comparison of
    kind `of` (a key of DEEPER_FLOORS; None: one composite)."""
    name = jnp.dtype(dtype).name
    where = on or backend()
    return max(_listed(FLOORS, where, name), _listed(DEEPER_FLOORS[of], where, name) if of is not None else 0.0)


def _listed(floors: dict[tuple[str, str], float], where: str, name: str) -> float:
    if (where, name) in floors:
        return floors[(where, name)]
    return max((v for (_, d), v in floors.items() if d == name), default=0.0)


def bound(value: float, dtype: Any = jnp.float32, of: str | None = None) -> float:
    """A bound written as `value` on CPU, at least this backend's floor elsewhere: for bounds that
    are not an allclose (`assert gap < bound(1e-5)`)."""
    return max(value, floor(dtype, of=of))


def close(rtol: float = 1e-7, atol: float = 0.0, dtype: Any = jnp.float32, of: str | None = None) -> dict[str, float]:
    """`rtol` and `atol` for `np.testing.assert_allclose` (whose defaults these are; also
    `np.allclose`, chex): the test's own where they hold (CPU), at least this backend's floor for
    `dtype` (and the kind `of` comparison) elsewhere. An atol of 0 stays 0: a purely relative bound
    is about values of any size, down to the smallest, which an absolute floor would make vacuous."""
    return {"rtol": bound(rtol, dtype, of), "atol": bound(atol, dtype, of) if atol > 0 else 0.0}


def approx(expected: Any, rel: float | None = None, abs: float | None = None,  # noqa: A002 (pytest's names)
           dtype: Any = jnp.float32) -> Any:
    """`pytest.approx(expected, rel=, abs=)` with the floors of `close`, an abs of 0 staying 0
    (neither given: pytest.approx's default, rel=1e-6)."""
    if rel is None and abs is None:
        rel = 1e-6
    return pytest.approx(expected, rel=None if rel is None else bound(rel, dtype),
                         abs=None if abs is None else bound(abs, dtype) if abs > 0 else 0.0)

