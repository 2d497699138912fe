"""Joining a multi-process run (`jax.distributed`) before JAX starts its backend.

How many processes there are and which one this is describe the launch, not
the run: they differ between the processes of one run and may change when a
run is resumed, so they are command-line options (or environment variables),
never settings saved in the run folder. A process joins when
  - `--coordinator HOST:PORT`, `--num-processes N` and `--process-id I` are given,
    or the environment variables JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES and
    JAX_PROCESS_ID (the first is JAX's own; the options win over them), or
  - `--distributed` is given: JAX detects the cluster itself (Cloud TPU,
    SLURM, Open MPI, Kubernetes) and fills in whatever was not given.
Otherwise the run is one process, as before.

On CPU the processes exchange data through gloo (XLA's CPU collectives), so a
multi-process run can be tried on one machine.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping

import jax
from rl_core import ConfigError

ENV_ADDRESS, ENV_COUNT, ENV_ID = "JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Launch:
    """This process's part of a multi-process launch; all None and `auto` False: one process."""

    coordinator: str | None = None
    num_processes: int | None = None
    process_id: int | None = None
    auto: bool = False

    @property
    def joins(self) -> bool:
        return self.auto or any(v is not None for v in (self.coordinator, self.num_processes, self.process_id))


def launch_from(
    coordinator: str | None, num_processes: int | None, process_id: int | None, auto: bool,
    env: Mapping[str, str] = os.environ,
) -> Launch:
    """Options first, then the environment; checked before anything starts."""

    def number(value: int | None, name: str) -> int | None:
        if value is not None or not env.get(name):
            return value
        try:
            return int(env[name])
        except ValueError:
            raise ConfigError(f"{name}={env[name]!r}: must be an integer") from None

    launch = Launch(
        coordinator=coordinator or env.get(ENV_ADDRESS) or None,
        num_processes=number(num_processes, ENV_COUNT),
        process_id=number(process_id, ENV_ID),
        auto=auto,
    )
    if launch.joins and not launch.auto and None in (launch.coordinator, launch.num_processes, launch.process_id):
        raise ConfigError(
            "a multi-process run needs the coordinator address, the number of processes and this process's id "
            f"(--coordinator/{ENV_ADDRESS}, --num-processes/{ENV_COUNT}, --process-id/{ENV_ID}; "
            f"got {launch.coordinator!r}, {launch.num_processes!r}, {launch.process_id!r}), "
            "or --distributed to let JAX detect the cluster (TPU, SLURM, Open MPI, Kubernetes)"
        )
    if launch.num_processes is not None and launch.num_processes < 1:
        raise ConfigError(f"--num-processes = {launch.num_processes}: must be >= 1")
    if launch.process_id is not None and launch.num_processes is not None and not 0 <= launch.process_id < launch.num_processes:
        raise ConfigError(f"--process-id = {launch.process_id}: must be in [0, {launch.num_processes})")
    return launch


def join(launch: Launch) -> None:
    """`jax.distributed.initialize` for `launch` (nothing for a one-process launch).

    Must run before anything touches JAX's devices.
    """
    if not launch.joins:
        return
    # XLA:CPU has no cross-process collectives of its own; harmless on GPU and TPU
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        coordinator_address=launch.coordinator,
        num_processes=launch.num_processes,
        process_id=launch.process_id,
    )
