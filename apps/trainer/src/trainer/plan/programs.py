"""The learner's own programs for `trainer plan`, on abstract arrays: nothing is allocated.

Each piece comes from the algorithm's own objects, as the learner makes it: the policy's loss is
its learner's `loss_of` (rl_core.learner.pipeline.PolicyGradientLearner.loss_of; SAPO's gate
included), the batch the update takes is its learner's `example_spec` laid out by
`rl_core.train.layout.BatchLayout.abstract_mini_batch`, the update is
`rl_core.train.trainable.update_program` of that loss, the reference and behaviour passes are
`rl_core.train.trainable.forward_program` of the learner's log-prob function
(`rl_core.train.behaviour.logprob_fn`), and the shardings are `rl_core.train.trainable.model_shardings`.
What differs is only the inputs: sharded `jax.ShapeDtypeStruct`s (`rl_core.train.trainable.abstract_model`
for the state) at the widest shapes a step can have.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from rl_core import ConfigError


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


def policy_loss(algo_name: str, algo: Any, rollout: Any, passes: Any) -> Any:
    """The policy's loss a run of algorithm `algo_name` (config `algo`) trains: its learner's own
    `loss_of` (rl_core.learner.pipeline.PolicyGradientLearner.loss_of), which a variant may override."""
    from rl_core import registry
    from rl_core import PolicyGradientLearner

    learner = registry.get_algorithm(algo_name).learner
    if not issubclass(learner, PolicyGradientLearner):
        raise ConfigError(f"trainer plan compiles rl_core.learner.pipeline's update; {algo_name}'s learner "
                          f"{learner.__name__} is not a PolicyGradientLearner")
    return learner.loss_of(algo, rollout, passes)


def policy_programs(settings: Any, mesh: Any, graphdef: Any, params: Any, frozen: Any) -> PolicyPrograms:
    """The policy's programs of a run with `settings` (a RunSettings) on `mesh`, for a module split
    (rl_core.policy.frozen.split_policy of its `nnx.eval_shape`) into `graphdef`, trained `params` and `frozen` base."""
    from rl_core import registry
    from rl_core.train import LogprobPasses, logprob_fn
    from rl_core import BatchLayout
    from rl_core import make_optimizer
    from rl_core.train import abstract_model, forward_program, model_shardings, update_program

    algo = settings.algorithm_config()
    training, rollout = settings.training, settings.rollout
    group = algo.group_size
    try:
        layout = BatchLayout(training, training.prompts_per_step * group, mesh, group)
    except ValueError as e:
        if isinstance(e, ConfigError):
            raise  # rows a micro-batch cannot split over the devices
        raise ConfigError(str(e)) from e
    n_mini = layout.num_mini_batches
    passes = LogprobPasses.of(algo, num_mini_batches=n_mini, async_rollout=training.async_rollout)
    loss_fn = policy_loss(settings.algo, algo, rollout, passes)
    tx = make_optimizer(training, training.num_steps * algo.num_iterations * n_mini)
    shardings = model_shardings(params, frozen, tx, mesh)
    state, frozen_abstract = abstract_model(params, frozen, tx, shardings)
    update = update_program(graphdef, tx, loss_fn, shardings, mesh)
    logprobs = forward_program(graphdef, logprob_fn(rollout), shardings, mesh, packs=layout.packing, shares=True)

    # a run's prompts are at most rollout.max_prompt_tokens wide, BOS included (rl_core.policy.encode_prompts),
    # so these are the shapes a run's programs take at its widest prompts and completions
    p_len, t_len = rollout.max_prompt_tokens, rollout.max_new_tokens
    # one micro-batch of the examples the learner makes (its own `example_spec`)
    micro = registry.get_algorithm(settings.algo).learner.example_spec(
        algo, passes, rows=layout.micro_size, prompt_tokens=p_len, completion_tokens=t_len)

    def mini_batch(n: int) -> Any:
        return layout.abstract_mini_batch(micro, n)

    def pass_inputs(n: int) -> tuple:
        example = mini_batch(n)
        last = example.packed if layout.packing else example.shared_prompts
        return example.prompt_tokens, example.prompt_mask, example.completion_tokens, last

    return PolicyPrograms(algo=algo, passes=passes, layout=layout, tx=tx, shardings=shardings, state=state,
                          frozen=frozen_abstract, update=update, logprobs=logprobs, p_len=p_len, t_len=t_len,
                          mini_batch=mini_batch, pass_inputs=pass_inputs)
