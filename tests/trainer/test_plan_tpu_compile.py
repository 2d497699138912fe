"""`trainer plan --platform tpu`: the TPU compiler ahead of time where libtpu is importable (no chip
needed), else XLA:CPU's sizes with the update's temporaries calibrated (trainer.plan.tpu_compile)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
from rl_core import ConfigError
from trainer.bench.memory_check import FIT_HEADROOM
from trainer.plan import GIB, MemoryBudget, Plan, memory_budget
from trainer.plan.device_memory import COMPILER_HEADROOM, tpu_chip_memory_gb
from trainer.plan.tpu_compile import CPU_OVER_TPU, calibrated, libtpu_importable, topology_name, tpu_compiler

needs_libtpu = pytest.mark.skipif(not libtpu_importable(), reason="libtpu is not installed (uv sync --extra tpu)")


def test_the_v5e_slice_of_each_chip_count():
    assert [topology_name(n) for n in (1, 4, 8, 16)] == ["v5e:1x1", "v5e:2x2", "v5e:2x4", "v5e:4x4"]
    with pytest.raises(ConfigError, match="a TPU v5e slice has 1, 4, 8, 16"):
        topology_name(3)


@pytest.mark.parametrize("chips", [1, 4, 8, 16])
def test_a_tpu_plan_by_default_counts_a_v5e_chips_allocator_limit_on_every_slice(chips):
    """Each chip of a v5e slice offers 15.75 GiB (its allocator's `bytes_limit`, the "available HBM (15.75G)"
    XLA:TPU compiles against), all of it usable. Less the 5% a plan compiled by XLA:TPU keeps, that is
    15.75 x 0.95 = 14.96 GiB: what `trainer bench` on the chip plans against (its device's free memory less
    the same 5%), so both pick the same settings."""
    budget = memory_budget("tpu", device_memory_gb=tpu_chip_memory_gb(chips), headroom=COMPILER_HEADROOM)
    assert (budget.device_memory_bytes, budget.fraction) == (int(15.75 * GIB), 1.0)
    assert round(budget.limit_bytes / GIB, 2) == 14.96
    on_the_chip = MemoryBudget("tpu", int(15.75 * GIB), 1.0, "tpu device, free of its allocator limit",
                               headroom=FIT_HEADROOM["tpu"])
    assert budget.limit_bytes == on_the_chip.limit_bytes
    assert memory_budget("tpu").device_memory_bytes == budget.device_memory_bytes  # with no --devices either


def test_a_tpu_plan_for_a_chip_count_no_v5e_slice_has_is_one_line(capsys):
    from trainer.cli import main

    assert main(["plan", "--platform", "tpu", "--devices", "3", "--preset", "tiny"]) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines() == ["trainer plan: error: --devices = 3: a TPU v5e slice has 1, 4, 8, 16, 32, 64, "
                                        "128, 256 chips"], err


def test_the_calibration_scales_the_update_temporaries_alone():
    """10 GiB of float32 weights and AdamW moments are the same on both compilers; 4.82 GiB of XLA:CPU
    update temporaries are 4.82 / 0.957 = 5.04 GiB on XLA:TPU."""
    compiled = {"parameters_and_optimizer_state": 10 * GIB, "frozen_base": 0, "reference": 0,
                "update_temporaries": int(4.82 * GIB), "rollout_temporaries": 0, "reference_temporaries": None}
    plan = Plan("m", {"data": 1, "fsdp": 1, "tensor": 1}, 1, 1, compiled, {"loaded_model": 0}, memory_budget("tpu"))
    scaled = calibrated(plan, CPU_OVER_TPU)
    assert scaled.resident_bytes == plan.resident_bytes == 10 * GIB
    assert CPU_OVER_TPU == 0.957 and scaled.program_bytes["update"] == int(int(4.82 * GIB) / 0.957)
    assert round(scaled.program_bytes["update"] / GIB, 2) == 5.04
    assert scaled.peak_bytes == 10 * GIB + int(int(4.82 * GIB) / CPU_OVER_TPU)


@pytest.mark.skipif(libtpu_importable(), reason="libtpu is installed: the TPU compiler is used, not the calibration")
def test_without_libtpu_a_tpu_plan_says_it_is_calibrated():
    compiler = tpu_compiler(1)
    assert compiler.devices is None and compiler.calibration == CPU_OVER_TPU and compiler.plan_options() == {}
    assert "calibrated" in compiler.description and "uv sync --extra tpu" in compiler.description


# the CPU backend stays JAX's default, libtpu only compiles; it may be loaded by another process already
# (this one's JAX, where the suite runs without JAX_PLATFORMS=cpu), which its lock file would refuse
ENV = dict(os.environ, JAX_PLATFORMS="cpu", ALLOW_MULTIPLE_LIBTPU_LOAD="1")


def _run(script: str) -> str:
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], env=ENV, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-4000:]
    return out.stdout


@needs_libtpu
def test_xla_tpu_compiles_for_a_v5e_with_no_chip_and_refuses_what_does_not_fit():
    """A 4096 x 4096 bfloat16 argument is 32 MiB on the chip. Two sorts of four 1 GiB float32 copies of a
    16384 x 16384 argument each need 17 GiB of temporaries: XLA:TPU refuses them as on a 15.75 GiB v5e."""
    out = _run("""
        import jax, jax.numpy as jnp
        from jax.sharding import SingleDeviceSharding
        from trainer.plan.refusal import ProgramRefused, refusals_as_verdicts
        from trainer.plan.tpu_compile import topology_devices
        (device,) = topology_devices(1)
        one = SingleDeviceSharding(device)
        x = jax.ShapeDtypeStruct((4096, 4096), jnp.bfloat16, sharding=one)
        stats = jax.jit(lambda a: a @ a).lower(x).compile().memory_analysis()
        print("kind", device.device_kind, "argument", stats.argument_size_in_bytes, "backend", jax.default_backend())
        big = jax.ShapeDtypeStruct((16384, 16384), jnp.float32, sharding=one)
        four = lambda a, k: jnp.concatenate([a + k, a * 2, a * 3, a * 4], axis=0).ravel()
        try:
            with refusals_as_verdicts("tpu"):
                jax.jit(lambda a: jnp.sort(four(a, 0))[:10] + jnp.sort(four(a, 1))[-10:]).lower(big).compile()
            print("compiled")
        except ProgramRefused as e:
            print("refused", e.verdict())
    """)
    assert "kind TPU v5 lite argument 33554432 backend cpu" in out, out
    assert "refused does NOT fit: the TPU compiler needs 17.00 GiB of temporaries, the device has 15.75 GiB" in out, out


@needs_libtpu
@pytest.mark.e2e  # compiles the tiny model's programs with XLA:TPU (about a minute on 2 cores)
def test_trainer_plan_for_tpu_compiles_with_xla_tpu_ahead_of_time():
    out = subprocess.run([sys.executable, "-m", "trainer.cli", "plan", "--preset", "tiny", "--platform", "tpu"],
                         env=ENV, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-4000:]
    assert "tpu: compiled ahead of time by XLA:TPU for v5e:1x1 (libtpu, no chip needed)" in out.stdout
    assert "memory: remat=none, micro_batch_size=whole mini-batch (picked: counted" in out.stdout
    assert "attention splash on tpu" in out.stdout and "fits: peak" in out.stdout
