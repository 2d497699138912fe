"""`trainer plan` for an algorithm that trains a critic beside the policy (its learner declares
`extra_models = ("critic",)`: PPO).

The critic is built as `trainer.build.critic` builds it, on abstract arrays: the policy's
backbone without its unembedding plus a value head of D + 1 parameters; with LoRA its own
adapters and head over the policy's frozen base (shared: no frozen bytes of its own); from
`model.critic_path`, that folder's model, trained whole. It is counted like the policy:

  - resident for the whole run: its float32 master weights and optimizer state;
  - its update program (gradients, one micro-batch's activations): the learner's own
    (rl_core.train.trainable.update_program of the algorithm's critic loss, `critic_loss_function`),
    on the policy's mini-batch (the learner gives both models the same one);
  - its values pass at collection time (rl_core.train.trainable.forward_program of completion_values,
    one micro-batch at a time, as the learner runs it);
  - at startup only, a `critic_path` model as loaded, freed once its float32 copy is made.

The entries join the plan's `compiled` and `analytic` tables with a "critic_" prefix.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

CRITIC = "critic"


def has_critic(settings: Any) -> bool:
    """Whether the run's algorithm trains a critic (its learner lists one in `extra_models`)."""
    from rl_core import registry

    return CRITIC in registry.get_algorithm(settings.algo).learner.extra_models


@dataclasses.dataclass(frozen=True)
class PolicyLayout:
    """What `trainer.plan.plan` fixed for the policy's programs that the critic's share."""

    mesh: Any
    runtime: dict[str, Any]
    """The model's runtime settings as planned (scan_layers decided for the platform)."""
    micro: int
    """Rows of a micro-batch."""
    n_micro: int
    """Micro-batches of a mini-batch (one update)."""
    batch: int
    """Completions of a step (the values pass runs over them all)."""
    p_len: int
    t_len: int
    tx: Any
    """The optimizer (the critic's differs only in its learning rate, which costs no memory)."""
    sizes: Callable[..., tuple[int, int, int]]
    """(jitted, *args) -> (argument, output, temporary) bytes per device."""
    per_device: Callable[[Any], int]
    """Bytes per device of a tree of sharded ShapeDtypeStructs."""
    activation_bytes: Callable[[Any], int]
    """A TransformerConfig -> what one micro-batch's backward pass keeps per device."""
    mini_batch: Callable[[int], Any]
    """n -> the abstract TrainExample of n stacked micro-batches the update takes (trainer.plan.programs)."""


def critic_plan(settings: Any, policy: Callable[[], Any], layout: PolicyLayout
                ) -> tuple[int, dict[str, int], dict[str, int]]:
    """(parameters the critic trains, its compiled entries, its analytic entries) per device;
    `policy` builds the policy module as the plan does (adapters included)."""
    import jax
    from flax import nnx
    from rl_core.policy import frozen as frozen_lib
    from rl_core import registry
    from rl_core.train import abstract_model, forward_program, model_shardings, update_program
    from rl_core.policy import completion_values
    from rl_core.rollout import argument_bytes
    from rl_models import ValueModel, model_class, value_model_from_policy
    from rl_models.hf import load_hf_config

    path, confidence = settings.model.critic_path, settings.model.critic_confidence
    if path:
        config = load_hf_config(path, **layout.runtime)
        abstract = nnx.eval_shape(lambda: ValueModel(model_class(config)(config, rngs=nnx.Rngs(0)),
                                                    confidence=confidence))
    else:
        abstract = nnx.eval_shape(lambda: value_model_from_policy(policy(), confidence=confidence))
        config = abstract.config
    graphdef, trained, frozen_abstract, _ = frozen_lib.split_policy(abstract)
    mesh, tx = layout.mesh, layout.tx
    # the critic's shardings, state, update and values pass, as its TrainableModel makes them
    shardings = model_shardings(trained, frozen_abstract, tx, mesh)
    state, frozen = abstract_model(trained, frozen_abstract, tx, shardings)
    master, opt = state
    loss_fn = registry.get_algorithm(settings.algo).learner.critic_loss_function(settings.algorithm_config())
    update_inputs = layout.mini_batch(layout.n_micro)
    update_args, _, update_temp = layout.sizes(update_program(graphdef, tx, loss_fn, shardings, mesh), state, frozen,
                                               update_inputs)
    # the values pass reads the prompt, its mask, the completion and the sampler's log-probs
    example = layout.mini_batch(layout.batch // layout.micro)
    inputs = (example.prompt_tokens, example.prompt_mask, example.completion_tokens, example.sampler_logp)
    values = forward_program(graphdef, completion_values, shardings, mesh, packs=False, shares=False)
    _, values_out, values_temp = layout.sizes(values, master, frozen, inputs)
    # a critic_path model as loaded: its own Params in their storage dtype, laid out like the trained ones
    loaded = jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh),
                          nnx.to_pure_dict(trained), shardings.params)
    # the policy's frozen base, shared: an argument, not the critic's own (each as the compiler lays it out)
    frozen_b, inputs_b = (argument_bytes(t, layout.sizes) for t in (frozen, update_inputs))
    params_b = layout.per_device(master)
    compiled = {
        "critic_parameters_and_optimizer_state": update_args - inputs_b - frozen_b,
        "critic_update_temporaries": update_temp,
        "critic_values_temporaries": values_temp + values_out,
    }
    analytic = {
        "critic_parameters": params_b,
        "critic_optimizer_state": layout.per_device(opt),
        "critic_gradients": params_b,
        "critic_activations": layout.activation_bytes(config),
        # a critic_path model as loaded (its storage dtype), until the learner's float32 copy exists
        "critic_loaded_model": layout.per_device(loaded) if path else 0,
    }
    trainable = sum(int(x.size) for x in jax.tree.leaves(master))
    return trainable, compiled, analytic
