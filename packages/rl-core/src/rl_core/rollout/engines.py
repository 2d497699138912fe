"""Rollout engines by name: what `rollout.engine` selects, found through entry points.

An engine is an `Engine` record: its name, a `build` that turns an `EngineBuild` (the run's
rollout settings, its settings and the policy's parts) into a `rl_core.rollout.backend.RolloutBackend`,
a `memory` that tells `trainer plan` what it holds on each device (rl_core.rollout.memory), its
`settings` class (what `rollout.options` holds for it) and what it `offers` before it is built
(row limits, retained sessions, weights mid-rollout, routing; agent episodes; when `auto` picks it).
`RolloutConfig` checks a run against the record, never against a name. A package adds one in a
single module plus one entry point, with no change here:

    [project.entry-points."rl_core.engines"]
    mine = "my_package.engine:ENGINE"

rl_core's own two are declared the same way (packages/rl-core/pyproject.toml) and are the
values below; their modules are imported only when one is built. This module imports nothing
heavy: a config reads the records when it is checked.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rl_core import registry
from rl_core.config import Config, ConfigError, RolloutConfig
from rl_core.rollout.capabilities import Capabilities
from rl_core.rollout.paged_settings import PagedSettings

PAGED_FROM_NEW_TOKENS = 512
"""`rollout.engine = "auto"` picks the paged engine from this many new tokens, the static sampler
below: where benchmarks/rollout_engines.py has paged win on both the small model and SmolLM2-135M
at 16 and 64 rows on CPU (2.0-3.1x with completions of varying length, even with all at the
maximum); at 64-256 static is as fast or faster on SmolLM2 (docs/results/2026-12-04-engine-choice.md)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class NoSettings(Config):
    """The settings of an engine that has none (`rollout.options` stays empty)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class EngineBuild:
    """What a run hands an engine to build its backend from."""

    rollout: RolloutConfig
    settings: Any = None
    """The engine's settings, its `Engine.settings` built from `rollout.options` (None: built here)."""
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
    settings: type = NoSettings
    """Its settings: a frozen dataclass that checks itself at construction (a `rl_core.config.Config`
    subclass, whose errors name the field); `rollout.options` are its keywords."""
    offers: Capabilities = Capabilities()
    """What its backends can do, before one is built (a built one may do less: `takes_published` only
    with rollout.partial_rollouts on). `takes_published` is what rollout.partial_rollouts needs."""
    serves_agents: bool = False
    """Agent episodes (rollout.agent) run on it: the run serves it in process as an OpenAI endpoint."""
    auto_from_new_tokens: int | None = None
    """`rollout.engine=auto` may pick it from this many new tokens (the one with the highest such
    threshold at or below the run's max_new_tokens); None: auto never picks it."""
    needs_paging: bool = False
    """It runs the policy through its paged adapter (`EngineBuild.paging`): auto passes it over for a
    policy without one."""

    def parse(self, options: Mapping[str, Any]) -> Any:
        """Its `settings` from `rollout.options`; one ConfigError line naming the setting otherwise."""
        where = f"RolloutConfig.options = {options!r}"
        if not isinstance(options, Mapping):
            raise ConfigError(f"{where}: must be a mapping of the engine's settings")
        fields = [f.name for f in dataclasses.fields(self.settings)]
        for key in options:
            if key not in fields:
                close = difflib.get_close_matches(str(key), fields, n=1)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                raise ConfigError(f"{where}: rollout.engine={self.name!r} has no setting {key!r}{hint} "
                                  f"(its settings: {', '.join(fields) or 'none'})")
        try:
            if issubclass(self.settings, Config):
                return self.settings.from_dict(dict(options))
            return self.settings(**options)
        except (TypeError, ValueError) as e:  # ConfigError is a ValueError
            raise ConfigError(f"{where}: {' '.join(str(e).split())} (rollout.engine={self.name!r})") from None


def engine_record(engine: str, max_new_tokens: int, *, pageable: bool = True) -> Engine:
    """The record `rollout.engine = engine` names; "auto": of the engines auto may pick (those that
    need a paged adapter only when the policy has one: `pageable`), the one with the highest
    `auto_from_new_tokens` at or below `max_new_tokens`. ConfigError when none is there."""
    if engine != "auto":
        try:
            return registry.get_engine(engine)
        except registry.RegistryError as e:
            raise ConfigError(f"RolloutConfig.engine = {engine!r}: {e}") from None
    fit = [r for r in auto_candidates(pageable) if r.auto_from_new_tokens <= max_new_tokens]
    if not fit:
        raise ConfigError(f"RolloutConfig.engine = 'auto': no registered engine is picked at {max_new_tokens} new "
                          f"tokens (engines: {', '.join(registry.engine_names()) or 'none'}); name one")
    return max(fit, key=lambda r: (r.auto_from_new_tokens, r.name))


def auto_candidates(pageable: bool = True) -> list[Engine]:
    """The registered engines `auto` may pick, by their thresholds."""
    records = [registry.get_engine(name) for name in registry.engine_names()]
    return sorted((r for r in records if r.auto_from_new_tokens is not None and (pageable or not r.needs_paging)),
                  key=lambda r: (r.auto_from_new_tokens, r.name))


def offering(what: Callable[[Engine], bool]) -> list[str]:
    """Names of the registered engines whose record has `what` (for errors that say which would do)."""
    return [name for name in registry.engine_names() if what(registry.get_engine(name))]


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
    settings = EngineSettings.from_rollout(b.rollout, batch_size=b.batch_size, replicas=replicas, knobs=b.settings)
    return PagedBackend(b.graphdef, settings, paging=b.paging, eos_ids=b.eos_ids, pad_id=b.pad_id, mesh=b.mesh,
                        param_shardings=b.param_shardings, partial_rollouts=b.rollout.partial_rollouts)


def _static_memory(q: Any) -> Any:
    from rl_core.rollout.memory import static_memory

    return static_memory(q)


def _paged_memory(q: Any) -> Any:
    from rl_core.rollout.memory import paged_memory

    return paged_memory(q)


STATIC = Engine(name="static", build=_static, memory=_static_memory,
                offers=Capabilities(keeps_reference=True, routing=True), auto_from_new_tokens=0)
"""The one-program sampler (rl_core.rollout.static): no settings; auto's pick below PAGED_FROM_NEW_TOKENS."""
PAGED = Engine(name="paged", build=_paged, memory=_paged_memory, settings=PagedSettings,
               offers=Capabilities(row_limits=True, retains=True, takes_published=True, counts_prefill=True,
                                   routing=True),
               serves_agents=True, auto_from_new_tokens=PAGED_FROM_NEW_TOKENS, needs_paging=True)
"""Paged KV cache and continuous batching (rl_core.rollout.paged), with `PagedSettings`."""
