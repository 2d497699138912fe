"""The learner's own programs for `trainer plan`, on abstract arrays: nothing is allocated.

A run's policy update is `rl_core.train.trainable.update_program` (the jitted `make_update`) of the
algorithm's loss as its learner binds it (`rl_core.train.objective.policy_loss_function`), and its
reference and behaviour passes are `rl_core.train.trainable.forward_program` of the learner's log-prob
function (`rl_core.train.behaviour.logprob_fn`); the shardings are `rl_core.train.trainable.model_shardings`
and the batch is cut by `rl_core.train.layout.BatchLayout`, all exactly as the learner makes them. What
differs is only the inputs: sharded `jax.ShapeDtypeStruct`s (`rl_core.train.trainable.abstract_model`
for the state) at the widest shapes a step can have, a mini-batch `TrainExample` holding the
fields the learner's would hold (behaviour log-probs when `LogprobPasses.behaviour`, reference
log-probs when beta != 0, the teacher's when distilling, the sampler's always, per-token advantages, returns and values for an
algorithm with a critic, each group's prompt once where the layout shares them).

With `training.packing`, the packed rows are planned at their most: one sequence per row (the
count a step compiles for depends on its lengths; rl_core.train.packing).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from rl_core.config import ConfigError


@dataclasses.dataclass(frozen=True)
class PolicyPrograms:
    """The policy's programs, shardings and abstract state as the learner would make them."""

    algo: Any
    """The algorithm's config."""
    passes: Any
    """rl_core.train.behaviour.LogprobPasses: which log-prob passes a step runs."""
    layout: Any
    """rl_core.train.layout.BatchLayout of the step's batch."""
    tx: Any
    """The optimizer (rl_core.train.optim.make_optimizer over the run's updates)."""
    shardings: Any
    """rl_core.train.trainable.ModelShardings."""
    state: Any
    """rl_core.train.trainable.TrainState of sharded ShapeDtypeStructs (float32 masters, optimizer state)."""
    frozen: Any
    """The frozen base (empty without adapters), sharded ShapeDtypeStructs."""
    update: Any
    """The jitted update (rl_core.train.trainable.update_program)."""
    logprobs: Any
    """The jitted log-prob pass (rl_core.train.trainable.forward_program)."""
    p_len: int
    t_len: int
    mini_batch: Callable[[int], Any]
    """n -> a TrainExample of n stacked micro-batches (what the update takes)."""
    pass_inputs: Callable[[int], tuple]
    """n -> the log-prob pass's inputs for n stacked micro-batches (as rl_core.train.layout.micro_batched stacks them)."""


def policy_programs(settings: Any, mesh: Any, graphdef: Any, params: Any, frozen: Any) -> PolicyPrograms:
    """The policy's programs of a run with `settings` (a RunSettings) on `mesh`, for a module split
    (rl_core.policy.frozen.split_policy of its `nnx.eval_shape`) into `graphdef`, trained `params` and `frozen` base."""
    import jax
    import jax.numpy as jnp
    from rl_core.runtime import mesh as mesh_lib
    from rl_core import registry
    from rl_core.train.behaviour import LogprobPasses, logprob_fn
    from rl_core.train.layout import BatchLayout
    from rl_core.train.objective import policy_loss_function
    from rl_core.train.optim import make_optimizer
    from rl_core.train.packing import Packed
    from rl_core.learner.pipeline import PolicyGradientLearner
    from rl_core.train.trainable import abstract_model, forward_program, model_shardings, update_program
    from rl_core.types import SharedPrompts, TrainExample

    algo = settings.algorithm_config()
    learner = registry.get_algorithm(settings.algo).learner
    if not issubclass(learner, PolicyGradientLearner):
        raise ConfigError(f"trainer plan compiles rl_core.learner.pipeline's update; {settings.algo}'s learner "
                          f"{learner.__name__} is not a PolicyGradientLearner")
    training, rollout = settings.training, settings.rollout
    group = getattr(algo, "group_size", 1)
    try:
        layout = BatchLayout(training, training.prompts_per_step * group, mesh, group)
    except ValueError as e:
        if isinstance(e, ConfigError):
            raise  # rows a micro-batch cannot split over the devices
        raise ConfigError(str(e)) from e
    n_mini = layout.num_mini_batches
    passes = LogprobPasses.of(algo, num_mini_batches=n_mini, async_rollout=training.async_rollout)
    tx = make_optimizer(training, training.num_steps * algo.num_iterations * n_mini)
    shardings = model_shardings(params, frozen, tx, mesh)
    state, frozen_abstract = abstract_model(params, frozen, tx, shardings)
    loss_fn = policy_loss_function(algo, rollout, beta=passes.loss_beta, async_rollout=training.async_rollout)
    update = update_program(graphdef, tx, loss_fn, shardings, mesh)
    logprobs = forward_program(graphdef, logprob_fn(rollout), shardings, mesh, packs=layout.packing, shares=True)

    p_len, t_len = rollout.max_prompt_tokens + 1, rollout.max_new_tokens  # + BOS
    micro, rows = layout.micro_size, mesh_lib.rows(mesh, axis=1)
    critic = bool(getattr(learner, "extra_models", ()))
    per_token_advantages = algo.estimator_category == "token_advantage_estimator"

    def stacked(n: int, *shape: int, dtype: Any = jnp.float32) -> jax.ShapeDtypeStruct:
        return jax.ShapeDtypeStruct((n, *shape), dtype, sharding=rows)

    def mini_batch(n: int) -> TrainExample:
        def per_token(present: bool = True) -> jax.ShapeDtypeStruct | None:
            return stacked(n, micro, t_len) if present else None

        shared = None
        if layout.prompt_group > 1:  # each device's rows are whole groups of one prompt
            shared = SharedPrompts(stacked(n, micro // layout.prompt_group, p_len, dtype=jnp.int32),
                                   stacked(n, micro // layout.prompt_group, p_len))
        packed = None
        if layout.packing:  # at most one sequence per packed row
            row = stacked(n, micro, p_len + t_len, dtype=jnp.int32)
            packed = Packed(row, row, row, stacked(n, micro, t_len, dtype=jnp.int32))
        return TrainExample(
            prompt_tokens=stacked(n, micro, p_len, dtype=jnp.int32), prompt_mask=stacked(n, micro, p_len),
            completion_tokens=stacked(n, micro, t_len, dtype=jnp.int32), completion_mask=per_token(),
            advantages=per_token() if per_token_advantages else stacked(n, micro),
            old_logp=per_token(passes.behaviour), ref_logp=per_token(passes.reference), sampler_logp=per_token(),
            returns=per_token(critic), values=per_token(critic), packed=packed, shared_prompts=shared,
            teacher_logp=per_token(passes.teacher),
        )

    def pass_inputs(n: int) -> tuple:
        example = mini_batch(n)
        last = example.packed if layout.packing else example.shared_prompts
        return example.prompt_tokens, example.prompt_mask, example.completion_tokens, last

    return PolicyPrograms(algo=algo, passes=passes, layout=layout, tx=tx, shardings=shardings, state=state,
                          frozen=frozen_abstract, update=update, logprobs=logprobs, p_len=p_len, t_len=t_len,
                          mini_batch=mini_batch, pass_inputs=pass_inputs)

