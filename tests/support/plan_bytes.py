"""What a plan's compiled column holds for a run's arrays, on any backend: the arrays as this host's
compiler lays them out (`rl_core.rollout.argument_bytes`). XLA:CPU lays them out dense, so these are
the hand counts; XLA:TPU pads each array to its tiles, so the tiny preset's 346,880 float32 bytes
take 461,312 there (v5e)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx


def planned_parts(settings: Any, *, critic: bool = False) -> tuple[dict, dict]:
    """(trained, frozen) abstract weights as `trainer plan` builds the model of `settings` (its
    planned config, adapters where LoRA is on), or with `critic` the critic over that policy (its
    backbone or adapters, value head and confidence head)."""
    from rl_core.policy import frozen as frozen_lib
    from rl_models import model_class, value_model_from_policy
    from rl_models.lora import add_adapters
    from trainer.plan.planner import planned_config

    config, _ = planned_config(settings.model)
    lora = settings.model.lora

    def build():
        model = model_class(config)(config, rngs=nnx.Rngs(0))
        if lora.rank:
            model = add_adapters(model, rank=lora.rank, alpha=lora.alpha, targets=lora.targets)
        return value_model_from_policy(model, confidence=settings.model.critic_confidence) if critic else model

    _, trained, frozen, _ = frozen_lib.split_policy(nnx.eval_shape(build))
    return nnx.to_pure_dict(trained), nnx.to_pure_dict(frozen)


def step_counters(n: int = 2) -> list:
    """`n` int32 scalars: the optimizer's step counters (AdamW's and the schedule's)."""
    return [jax.ShapeDtypeStruct((), jnp.int32)] * n
