"""`trainer plan --platform tpu` with the TPU compiler, on a host with no TPU.

Where libtpu is importable (`uv sync --extra tpu`), the plan's programs are compiled ahead of time for
a TPU topology with no chip attached: `jax.experimental.topologies.get_topology_desc` gives the
devices of a v5e slice, the mesh is laid over them, and `jax.jit(...).lower(...).compile()` runs
XLA:TPU, whose `memory_analysis()` is the chip's own (MaxText's train_compile.py does the same on
CPU hosts). The CPU backend stays JAX's default (`trainer plan` sets JAX_PLATFORMS=cpu), so nothing
else changes. A program over the chip's memory is refused by that compiler as on the chip
(trainer.plan.refusal).

Without libtpu the programs are compiled by XLA:CPU, whose buffer assignment is not the TPU's; the
update's temporaries are scaled by a measured ratio (`CPU_OVER_TPU`, `calibrated`), labelled as a
calibration wherever it is printed.

What the chip "uses" is the TPU compiler's figure: `Device.memory_stats()["peak_bytes_in_use"]` on a
TPU leaves out a program's temporaries (a program that XLA:TPU gives 13.0 GiB of temporaries left
the peak at 1.01 GiB, its 1 GiB argument and output), so a peak read from the allocator (6.14 GiB for
the Qwen2.5-0.5B shape's remat=full step) is the resident state and arguments alone.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from typing import Any

V5E_SLICES = {1: (1, 1), 4: (2, 2), 8: (2, 4), 16: (4, 4), 32: (4, 8), 64: (8, 8), 128: (8, 16), 256: (16, 16)}
"""Chips of a TPU v5e slice -> its topology (rows x columns of chips)."""
V5E_HOST = (2, 4)
"""A v5e host's chips at most (a slice of up to 8 chips is one host)."""

CPU_OVER_TPU = 0.957
"""XLA:CPU's update temporaries over XLA:TPU's for the same program, one point: the Qwen2.5-0.5B shape
(bfloat16, 16 prompts x 8 completions, 256 new tokens, remat=full, beta 0, one v5e), 10.37 GiB on XLA:CPU
and 10.83 GiB on XLA:TPU ahead of time (10.37 / 10.83 = 0.957; resident state 4.00 GiB on both, peaks
14.37 and 14.84). At remat=none XLA:TPU refuses 70.66 GiB of temporaries, the figure the chip's own
compile gave. A calibration, not a model of XLA:TPU: other shapes and policies may differ."""


def libtpu_importable() -> bool:
    """Whether the TPU compiler is installed here (with or without a chip)."""
    return importlib.util.find_spec("libtpu") is not None


def topology_name(chips: int) -> str:
    """The v5e topology of a slice of `chips` chips, e.g. 'v5e:2x2'; ConfigError for a size v5e has not."""
    from rl_core import ConfigError

    if chips not in V5E_SLICES:
        raise ConfigError(f"--devices = {chips}: a TPU v5e slice has {', '.join(map(str, V5E_SLICES))} chips")
    rows, cols = V5E_SLICES[chips]
    return f"v5e:{rows}x{cols}"


def topology_devices(chips: int) -> list[Any]:
    """The devices of a v5e slice of `chips` chips, for compiling ahead of time (no chip needed)."""
    from jax.experimental import topologies

    rows, cols = V5E_SLICES[chips] if chips in V5E_SLICES else (0, 0)
    name = topology_name(chips)
    host = (rows, cols, 1) if chips <= V5E_HOST[0] * V5E_HOST[1] else (*V5E_HOST, 1)
    return list(topologies.get_topology_desc(platform="tpu", topology_name=name, chips_per_host_bounds=host,
                                             num_slices=1).devices)


@dataclasses.dataclass(frozen=True)
class Compiler:
    """Which compiler a TPU plan's sizes come from, and how they are read."""

    devices: list[Any] | None
    """The topology's devices (None: this host's CPU devices)."""
    description: str
    calibration: float | None = None
    """Divide the update's temporaries by this (XLA:CPU standing in for XLA:TPU), else None."""

    def plan_options(self) -> dict[str, Any]:
        """`trainer.plan.planner.plan`'s keyword arguments for this compiler."""
        return {"devices": self.devices, "kernels": True} if self.devices is not None else {}


def tpu_compiler(chips: int) -> Compiler:
    """XLA:TPU ahead of time where libtpu is importable, else XLA:CPU with the calibration."""
    if libtpu_importable():
        return Compiler(topology_devices(chips), f"compiled ahead of time by XLA:TPU for {topology_name(chips)} "
                                                 "(libtpu, no chip needed)")
    return Compiler(None, f"compiled by XLA:CPU (libtpu is not installed: `uv sync --extra tpu` compiles for the "
                          f"TPU); update temporaries calibrated: XLA:CPU's / {CPU_OVER_TPU}, a ratio measured on one shape",
                    CPU_OVER_TPU)


def calibrated(plan: Any, factor: float) -> Any:
    """`plan` with its compiled update temporaries divided by `factor` (the calibration above)."""
    compiled = dict(plan.compiled)
    compiled["update_temporaries"] = int(compiled["update_temporaries"] / factor)
    return dataclasses.replace(plan, compiled=compiled)
