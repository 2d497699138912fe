"""How much of a device's memory a run may plan to use: the runtime's share, less a margin.

  gpu  JAX's GPU client preallocates a fraction of each GPU's memory and allocates from that pool:
       75% unless XLA_CLIENT_MEM_FRACTION (older JAX: XLA_PYTHON_CLIENT_MEM_FRACTION; both at once
       is an error) says otherwise. XLA_PYTHON_CLIENT_PREALLOCATE=false allocates on demand but
       keeps the same limit. Newer JAX releases may grow the pool past 75% when nothing else holds
       the memory; the plan counts on the fraction only.
  tpu  a chip's allocator limit, all of it: what `jax.devices()[0].memory_stats()["bytes_limit"]`
       gives on the host and what XLA:TPU compiles against ("exceeds available HBM (15.75G)"). For a
       TPU v5e, the only generation `trainer plan --platform tpu` plans for, that is 15.75 GiB per chip
       on every slice (v5e-1 to v5e-256: the chip is the same; `tpu_chip_memory_gb`).
  cpu  host memory, nothing reserved.

A plan fits when its peak is at most (1 - headroom) of the usable memory: fragmentation, the
programs' own code and scratch, and what the plan does not see (XLA on the accelerator lays out
temporaries otherwise than XLA:CPU) need room.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping

from rl_core import ConfigError

GIB = 1024**3
PLATFORMS = ("gpu", "tpu", "cpu")
V5E_CHIP_GB = 15.75
"""A TPU v5e chip's allocator limit in GiB (16 GiB of HBM less what the runtime keeps): `bytes_limit` of
`Device.memory_stats()` on a v5e host, and the "available HBM (15.75G)" XLA:TPU compiles against, on the
chip and ahead of time for a v5e topology (2026-12-06)."""
DEFAULT_DEVICE_MEMORY_GB = {"gpu": 80.0, "tpu": V5E_CHIP_GB, "cpu": 80.0}
"""An 80 GB GPU (A100, H100), a TPU v5e chip's allocator limit; for cpu, a round number."""
GPU_FRACTION_VARS = ("XLA_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_MEM_FRACTION")
GPU_DEFAULT_FRACTION = 0.75
TPU_FRACTION = 1.0
"""The share of `V5E_CHIP_GB` a run may use: all of it, the limit being the allocator's own already."""
DEFAULT_HEADROOM = 0.10
COMPILER_HEADROOM = 0.05
"""The headroom where the figures are the target's own compiler's (XLA:TPU, on the chip or ahead of time:
trainer.plan.tpu_compile): the temporaries it gives are those the chip holds, so only the runtime's
own use and fragmentation need room. The Qwen2.5-0.5B shape's remat=full step needs 14.84 of a v5e's
15.75 GiB and runs there."""


@dataclasses.dataclass(frozen=True)
class MemoryBudget:
    """What one device offers a run, and the margin a plan keeps."""

    platform: str
    device_memory_bytes: int
    fraction: float
    """The share the runtime lets the program use."""
    fraction_source: str
    """Where `fraction` comes from, in words."""
    headroom: float
    """Share of the usable memory a plan leaves free."""

    @property
    def usable_bytes(self) -> int:
        return int(self.device_memory_bytes * self.fraction)

    @property
    def limit_bytes(self) -> int:
        """The most a plan's peak may take and still fit."""
        return int(self.usable_bytes * (1 - self.headroom))

    def describe(self) -> str:
        gib = lambda n: f"{n / GIB:.2f}"  # noqa: E731
        return (f"{self.platform}: {gib(self.device_memory_bytes)} GiB per device x {self.fraction:g} "
                f"({self.fraction_source}) = {gib(self.usable_bytes)} GiB usable; {self.headroom:.0%} "
                f"headroom -> {gib(self.limit_bytes)} GiB for the plan")


def memory_budget(platform: str = "gpu", *, device_memory_gb: float | None = None, fraction: float | None = None,
                  headroom: float = DEFAULT_HEADROOM, environ: Mapping[str, str] | None = None) -> MemoryBudget:
    """The budget of one `platform` device; `fraction` overrides the runtime's share (on GPU,
    else read from the environment `environ`, default os.environ)."""
    if platform not in PLATFORMS:
        raise ConfigError(f"--platform = {platform!r}: must be one of {', '.join(PLATFORMS)}")
    memory = DEFAULT_DEVICE_MEMORY_GB[platform] if device_memory_gb is None else device_memory_gb
    if not (memory > 0 and math.isfinite(memory)):
        raise ConfigError(f"--device-memory-gb = {memory}: must be a number > 0 (GiB per device)")
    if not 0 <= headroom < 1:
        raise ConfigError(f"--headroom = {headroom}: must be in [0, 1) (the share of usable memory kept free)")
    if fraction is not None:
        source = "--memory-fraction"
    elif platform == "gpu":
        fraction, source = _gpu_fraction(os.environ if environ is None else environ)
    elif platform == "tpu":
        fraction, source = TPU_FRACTION, "a v5e chip's allocator limit, all usable"
    else:
        fraction, source = 1.0, "host memory, nothing reserved"
    if not 0 < fraction <= 1:
        raise ConfigError(f"memory fraction = {fraction} ({source}): must be in (0, 1]")
    return MemoryBudget(platform, int(memory * GIB), fraction, source, headroom)


def tpu_chip_memory_gb(chips: int) -> float:
    """The default memory per device of `trainer plan --platform tpu --devices chips`: a v5e chip's
    allocator limit, the same on every slice; ConfigError for a chip count no v5e slice has."""
    from trainer.plan.tpu_compile import topology_name

    topology_name(chips)  # a slice v5e has, or the error naming those it has
    return V5E_CHIP_GB


def _gpu_fraction(environ: Mapping[str, str]) -> tuple[float, str]:
    set_vars = [(name, environ[name]) for name in GPU_FRACTION_VARS if environ.get(name)]
    if len(set_vars) > 1:
        raise ConfigError(f"{' and '.join(n for n, _ in set_vars)} are both set; JAX refuses both at once: "
                          f"keep {GPU_FRACTION_VARS[0]}")
    if not set_vars:
        return GPU_DEFAULT_FRACTION, f"JAX preallocates 75% on GPU; {GPU_FRACTION_VARS[0]} changes it"
    name, value = set_vars[0]
    try:
        return float(value), f"{name}={value}"
    except ValueError:
        raise ConfigError(f"{name} = {value!r}: must be a number in (0, 1]") from None
