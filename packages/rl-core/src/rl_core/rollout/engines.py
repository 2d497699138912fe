"""Rollout engines by name: what `rollout.engine` selects, found through entry points.

An engine is an `Engine` value: its name, a `build` that turns an `EngineBuild` (the run's
rollout settings and the policy's parts) into a `rl_core.rollout.backend.RolloutBackend`, and
a `memory` that tells `trainer plan` what it holds on each device (rl_core.rollout.memory).
A package adds one in a single module plus one entry point, with no change here:

    [project.entry-points."rl_core.engines"]
    mine = "my_package.engine:ENGINE"

rl_core's own two are declared the same way (packages/rl-core/pyproject.toml) and are the
values below; their modules are imported only when one is built.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from rl_core.config import RolloutConfig


@dataclasses.dataclass(frozen=True, kw_only=True)
class EngineBuild:
    """What a run hands an engine to build its backend from."""

    rollout: RolloutConfig
    graphdef: Any
    """The policy's `nnx.GraphDef` (what `nnx.merge` takes with the parameters `update_weights` gets)."""
    eos_ids: Sequence[int]
    pad_id: int
    mesh: Any = None
    """The run's `jax.sharding.Mesh` (None: one device)."""
    param_shardings: Any = None
    """Shardings of the parameters `update_weights` gets (None without a mesh)."""
    batch_size: int | None = None
    """Completions per rollout (an engine may size itself for them)."""
    sampler: Any = None
    """A `rl_core.rollout.sampler.Sampler` the learner already built (the static engine shares it)."""
    policy: Any = None
    """The policy model (only for naming it in errors)."""
    paging: Any = None
    """The policy's paged adapter (`rl_core.policy.protocols.PagedModel`), where it has one."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Engine:
    """A rollout engine: `rollout.engine = name` builds its backend with `build`."""

    name: str
    build: Callable[[EngineBuild], Any]
    """`EngineBuild` -> a `RolloutBackend`."""
    memory: Callable[[Any], Any]
    """`rl_core.rollout.memory.MemoryQuery` -> `EngineMemory`: the bytes it holds on each of the run's
    devices while it generates (its cache, its weight copy, its temporaries), what `trainer plan`
    counts for it (`rl_core.rollout.memory.memory_elsewhere` for an engine in another process)."""


def _static(b: EngineBuild) -> Any:
    from rl_core.rollout.sampler import Sampler
    from rl_core.rollout.static import StaticBackend

    sampler = b.sampler
    if sampler is None:
        sampler = Sampler(b.graphdef, max_new_tokens=b.rollout.max_new_tokens, eos_ids=b.eos_ids, pad_id=b.pad_id,
                          mesh=b.mesh, param_shardings=b.param_shardings)
    return StaticBackend(sampler)


def _paged(b: EngineBuild) -> Any:
    from rl_core.rollout.paged import EngineSettings, PagedBackend
    from rl_core.runtime import mesh as mesh_lib

    if b.paging is None:
        what = f" ({type(b.policy).__name__})" if b.policy is not None else ""
        raise TypeError(
            f"RolloutConfig.engine = 'paged' needs the policy's paged adapter{what}: pass paging= next to "
            f"policy= (an rl_core.policy.protocols.PagedModel; rl_models.PAGED_TRANSFORMER for rl_models' "
            f"transformers) or set rollout.engine='static'"
        )
    replicas = mesh_lib.batch_devices(b.mesh) if b.mesh is not None else 1
    settings = EngineSettings.from_rollout(b.rollout, batch_size=b.batch_size, replicas=replicas)
    return PagedBackend(b.graphdef, settings, paging=b.paging, eos_ids=b.eos_ids, pad_id=b.pad_id, mesh=b.mesh,
                        param_shardings=b.param_shardings, partial_rollouts=b.rollout.partial_rollouts)


def _static_memory(q: Any) -> Any:
    from rl_core.rollout.memory import static_memory

    return static_memory(q)


def _paged_memory(q: Any) -> Any:
    from rl_core.rollout.memory import paged_memory

    return paged_memory(q)


STATIC = Engine(name="static", build=_static, memory=_static_memory)
"""The one-program sampler (rl_core.rollout.static)."""
PAGED = Engine(name="paged", build=_paged, memory=_paged_memory)
"""Paged KV cache and continuous batching (rl_core.rollout.paged)."""
