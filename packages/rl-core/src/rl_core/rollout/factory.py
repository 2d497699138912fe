"""The rollout backend a `RolloutConfig` asks for (`rollout.engine`; "auto" is resolved by `resolve_engine`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from flax import nnx
from jax.sharding import Mesh

from rl_core import registry
from rl_core.config import RolloutConfig
from rl_core.policy.protocols import PagedModel
from rl_core.rollout.backend import RolloutBackend
from rl_core.rollout.engines import EngineBuild
from rl_core.rollout.sampler import Sampler


PAGED_FROM_NEW_TOKENS = 512
"""`rollout.engine = "auto"` picks the paged engine from this many new tokens, the static sampler
below: where benchmarks/rollout_engines.py has paged win on both the small model and SmolLM2-135M
at 16 and 64 rows on CPU (2.0-3.1x with completions of varying length, even with all at the
maximum); at 64-256 static is as fast or faster on SmolLM2 (docs/results/2026-12-04-engine-choice.md)."""


def resolve_engine(rollout: RolloutConfig, *, pageable: bool = True) -> str:
    """The engine a run uses: `rollout.engine` when it names one, else ("auto") the faster at the
    run's shape: "paged" from PAGED_FROM_NEW_TOKENS new tokens, "static" below. A policy without a
    paged adapter (`pageable=False`) gets "static" from "auto"; an explicit "paged" stays (and errors)."""
    if rollout.engine != "auto":
        return rollout.engine
    return "paged" if pageable and rollout.max_new_tokens >= PAGED_FROM_NEW_TOKENS else "static"


def explain_engine(rollout: RolloutConfig, *, pageable: bool = True) -> str:
    """`resolve_engine`'s choice and why, for a run's log: "paged (auto: 1024 new tokens >= 512)"."""
    engine = resolve_engine(rollout, pageable=pageable)
    if rollout.engine != "auto":
        return f"{engine} (rollout.engine={engine})"
    if not pageable:
        return f"{engine} (auto: the policy has no paged adapter)"
    sign = ">=" if engine == "paged" else "<"
    return f"{engine} (auto: {rollout.max_new_tokens} new tokens {sign} {PAGED_FROM_NEW_TOKENS})"


def make_backend(rollout: RolloutConfig, graphdef: nnx.GraphDef, *, eos_ids: Sequence[int], pad_id: int,
                 mesh: Mesh | None = None, param_shardings: Any = None, batch_size: int | None = None,
                 sampler: Sampler | None = None, policy: Any = None,
                 paging: PagedModel | None = None) -> RolloutBackend:
    """`resolve_engine`'s backend, built by the engine registered under its name
    (rl_core.rollout.engines); `static` wraps `sampler` when given (so its programs are shared).

    `paged` runs the model through `paging` (see `rl_core.policy.protocols.PagedModel`), which it requires;
    `policy` (optional) only names the model in the error when it is missing."""
    engine = registry.get_engine(resolve_engine(rollout, pageable=paging is not None))
    return engine.build(EngineBuild(rollout=rollout, graphdef=graphdef, eos_ids=eos_ids, pad_id=pad_id, mesh=mesh,
                                    param_shardings=param_shardings, batch_size=batch_size, sampler=sampler,
                                    policy=policy, paging=paging))
