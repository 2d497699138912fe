"""The rollout backend a `RolloutConfig` asks for (`rollout.engine`; "auto" is resolved by `resolve_engine`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from flax import nnx
from jax.sharding import Mesh

from rl_core.config import RolloutConfig
from rl_core.policy.protocols import PagedModel
from rl_core.rollout.backend import RolloutBackend
from rl_core.rollout.engines import PAGED_FROM_NEW_TOKENS, EngineBuild, auto_candidates
from rl_core.rollout.sampler import Sampler

__all__ = ["PAGED_FROM_NEW_TOKENS", "explain_engine", "make_backend", "resolve_engine"]  # the threshold lives with the records


def resolve_engine(rollout: RolloutConfig, *, pageable: bool = True) -> str:
    """The engine a run uses: `rollout.engine` when it names one, else ("auto") the one the engines'
    records pick at the run's max_new_tokens (rl_core.rollout.engines.engine_record: paged from
    PAGED_FROM_NEW_TOKENS new tokens, static below). An engine that needs a paged adapter is passed over
    by "auto" for a policy without one (`pageable=False`); an explicit "paged" stays (and errors)."""
    return rollout.engine_record(pageable=pageable).name


def explain_engine(rollout: RolloutConfig, *, pageable: bool = True) -> str:
    """`resolve_engine`'s choice and why, for a run's log: "paged (auto: 1024 new tokens >= 512)"."""
    record = rollout.engine_record(pageable=pageable)
    if rollout.engine != "auto":
        return f"{record.name} (rollout.engine={record.name})"
    if not pageable and rollout.engine_record().name != record.name:
        return f"{record.name} (auto: the policy has no paged adapter)"
    n = rollout.max_new_tokens
    if record.auto_from_new_tokens:
        return f"{record.name} (auto: {n} new tokens >= {record.auto_from_new_tokens})"
    higher = [r.auto_from_new_tokens for r in auto_candidates(pageable) if r.auto_from_new_tokens > n]
    return f"{record.name} (auto: {n} new tokens < {min(higher)})" if higher else f"{record.name} (auto)"


def make_backend(rollout: RolloutConfig, graphdef: nnx.GraphDef, *, eos_ids: Sequence[int], pad_id: int,
                 mesh: Mesh | None = None, param_shardings: Any = None, batch_size: int | None = None,
                 sampler: Sampler | None = None, policy: Any = None,
                 paging: PagedModel | None = None) -> RolloutBackend:
    """`resolve_engine`'s backend, built by the engine registered under its name
    (rl_core.rollout.engines) with its settings from `rollout.options`; `static` wraps `sampler` when
    given (so its programs are shared).

    `paged` runs the model through `paging` (see `rl_core.policy.protocols.PagedModel`), which it requires;
    `policy` (optional) only names the model in the error when it is missing."""
    engine = rollout.engine_record(pageable=paging is not None)
    return engine.build(EngineBuild(rollout=rollout, settings=engine.parse(rollout.options), graphdef=graphdef, eos_ids=eos_ids, pad_id=pad_id, mesh=mesh,
                                    param_shardings=param_shardings, batch_size=batch_size, sampler=sampler,
                                    policy=policy, paging=paging))
