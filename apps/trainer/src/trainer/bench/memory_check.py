"""What `trainer bench` will need per device, said and checked before anything is allocated.

The need is `trainer plan`'s peak (trainer.plan: the learner's own programs compiled on abstract
arrays, as this backend runs them); what there is, the device's free memory (an accelerator's
allocator limit less what is in use) or, on CPU, the host's available memory (MemAvailable), unless
`--memory-gb` says. A preset that would not fit (`long-generation`'s 16 x 8 completions of 1024
tokens on a small host) stops with one line instead of an out-of-memory traceback mid-run, and so
does one whose program the TPU compiler refuses while the plan compiles it (trainer.plan.refusal).
Before that, model.remat and training.micro_batch_size left at "auto" are picked to fit (`fit_memory`,
trainer.plan.choice); `trainer train` picks them the same way when a run starts.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
from rl_core import ConfigError

from trainer.plan import GIB, MemoryBudget
from trainer.plan.device_memory import COMPILER_HEADROOM, DEFAULT_HEADROOM
from trainer.plan.refusal import ProgramRefused


FIT_HEADROOM = {"tpu": COMPILER_HEADROOM}
"""The share of a device's free memory a pick leaves unplanned: on a TPU its figures are XLA:TPU's own;
elsewhere DEFAULT_HEADROOM, as `trainer plan` keeps."""


class DoesNotFit(ConfigError):
    """The preset's programs do not fit the memory free: the plan's verdict, or the TPU compiler's refusal."""


def available(memory_gb: float | None = None) -> tuple[int, str]:
    """(bytes one device may use, where that figure comes from)."""
    if memory_gb is not None:
        if not memory_gb > 0:
            raise ConfigError(f"--memory-gb = {memory_gb}: must be > 0 (GiB the benchmark may use per device)")
        return int(memory_gb * GIB), "--memory-gb"
    device = jax.devices()[0]
    stats = device.memory_stats() if device.platform != "cpu" else None
    if stats and stats.get("bytes_limit"):
        return stats["bytes_limit"] - stats.get("bytes_in_use", 0), f"{device.platform} device, free of its allocator limit"
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024, "host memory available (MemAvailable)"
    raise ConfigError("cannot tell the memory this machine has free; give it with --memory-gb N")


def device_budget(memory_gb: float | None = None, *, headroom: float = 0.0) -> MemoryBudget:
    """What one device of this backend offers (`available`), keeping `headroom` of it free."""
    free, source = available(memory_gb)
    platform = jax.default_backend()
    return MemoryBudget(platform if platform in ("cpu", "tpu") else "gpu", free, 1.0, source, headroom=headroom)


def as_run(settings: Any, platform: str) -> Any:
    """`settings` as this backend runs them: layers looped on accelerators, unrolled on CPU."""
    scan = platform != "cpu" if settings.model.scan_layers is None else settings.model.scan_layers
    return dataclasses.replace(settings, model=dataclasses.replace(settings.model, scan_layers=scan))


def fit_memory(settings: Any, *, memory_gb: float | None = None, log: Callable[[str], None] = print,
               programs: dict | None = None) -> Any:
    """`settings` with model.remat and training.micro_batch_size picked where they are "auto"
    (trainer.plan.choice): what fits this device, less a headroom (`FIT_HEADROOM`); the pick is one
    logged line. Raises `NothingFits` when nothing does. `programs` keeps compiled programs for a later plan."""
    from trainer.plan import training_peak
    from trainer.plan.choice import pick_memory

    budget = device_budget(memory_gb)
    budget = dataclasses.replace(budget, headroom=FIT_HEADROOM.get(budget.platform, DEFAULT_HEADROOM))
    memo = {} if programs is None else programs
    picked, _ = pick_memory(settings, budget.limit_bytes,
                            lambda s: training_peak(as_run(s, budget.platform), budget, compiled_programs=memo),
                            budget.platform, log=log)
    return picked


def check_memory(settings: Any, preset: str, *, memory_gb: float | None = None,
                 log: Callable[[str], None] = print) -> Any:
    """Pick the "auto" memory settings (`fit_memory`), plan the result on this backend, log the need against
    what is free, and stop when it does not fit. Returns the settings to run."""
    from trainer.plan import plan
    from trainer.plan.choice import Choice, NothingFits

    programs: dict = {}
    try:
        settings = fit_memory(settings, memory_gb=memory_gb, log=log, programs=programs)
        more = "run it on a machine with more memory, choose a smaller preset"
        refused = more + (", or keep less for the backward pass (model.remat=full)"
                          if settings.model.remat != "full" else "")
        over = more + ", or give the memory it may use with --memory-gb"
    except NothingFits as e:  # the plan of what keeps the least says by how much; the search, what to change
        settings = Choice(e.last, "", ("model.remat",)).apply(settings)
        refused = over = str(e).removeprefix("memory: ")
    budget = device_budget(memory_gb)
    free, source = budget.device_memory_bytes, budget.fraction_source
    try:
        planned = plan(as_run(settings, budget.platform), budget, compiled_programs=programs)
    except ProgramRefused as e:  # XLA:TPU refuses at compile time what XLA:CPU would size
        raise DoesNotFit(f"trainer bench --preset {preset} {e.verdict()}; {refused}") from None
    need = planned.peak_bytes
    log(f"memory: needs {_size(need)} per device (trainer plan's peak of these programs); {_size(free)} free ({source})")
    if need > free:
        raise DoesNotFit(
            f"trainer bench --preset {preset} needs {_size(need)} per device and {_size(free)} are free "
            f"({source}); {over}")
    return settings


def _size(n: int) -> str:
    return f"{n / GIB:.2f} GiB" if n >= GIB / 100 else f"{n / 2**20:.1f} MiB"
