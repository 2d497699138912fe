"""`trainer plan` for an algorithm that trains a critic beside the policy (its learner declares
`extra_models = ("critic",)`: PPO).

The critic is built as `trainer.build.critic` builds it, on abstract arrays: the policy's
backbone without its unembedding plus a value head of D + 1 parameters; with LoRA its own
adapters and head over the policy's frozen base (shared: no frozen bytes of its own); from
`model.critic_path`, that folder's model, trained whole. It is counted like the policy:

  - resident for the whole run: its float32 master weights and optimizer state;
  - its update program (gradients, one micro-batch's activations), compiled with a squared-error
    stand-in for the clipped value loss (the same arrays live), on the policy's mini- and micro-batches;
  - its values pass at collection time (one micro-batch at a time, as the learner runs it);
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
    update: Callable[..., Any]
    """(micro_loss, tx, shardings) -> the stand-in update program (trainer.plan.stand_in_update)."""


def critic_plan(settings: Any, policy: Callable[[], Any], layout: PolicyLayout
                ) -> tuple[int, dict[str, int], dict[str, int]]:
    """(parameters the critic trains, its compiled entries, its analytic entries) per device;
    `policy` builds the policy module as the plan does (adapters included)."""
    import jax
    import jax.numpy as jnp
    import optax
    from flax import nnx
    from rl_core import frozen as frozen_lib
    from rl_core import mesh as mesh_lib
    from rl_core.values import completion_values
    from rl_models import Transformer, ValueModel, value_model_from_policy
    from rl_models.hf import load_hf_config

    path, confidence = settings.model.critic_path, settings.model.critic_confidence
    if path:
        config = load_hf_config(path, **layout.runtime)
        abstract = nnx.eval_shape(lambda: ValueModel(Transformer(config, rngs=nnx.Rngs(0)), confidence=confidence))
    else:
        abstract = nnx.eval_shape(lambda: value_model_from_policy(policy(), confidence=confidence))
        config = abstract.config
    graphdef, trained, frozen_abstract, _ = frozen_lib.split_policy(abstract)
    mesh = layout.mesh

    def placed(state: Any, dtype: Any = None) -> Any:
        shardings = nnx.to_pure_dict(mesh_lib.param_shardings(state, mesh))
        return jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, dtype or s.dtype, sharding=sh),
                            nnx.to_pure_dict(state), shardings)

    master, frozen = placed(trained, jnp.float32), placed(frozen_abstract)
    shardings = jax.tree.map(lambda s: s.sharding, master)
    frozen_shardings = jax.tree.map(lambda s: s.sharding, frozen)
    tx = layout.tx
    opt_abstract = jax.eval_shape(tx.init, master)
    opt_shardings = optax.tree_map_params(tx, lambda _, s: s, opt_abstract, shardings,
                                          transform_non_params=lambda _: mesh_lib.replicated(mesh))
    opt = jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), opt_abstract, opt_shardings)
    rows = mesh_lib.rows(mesh, axis=1)

    def stacked(n: int, width: int, dtype: Any) -> jax.ShapeDtypeStruct:
        return jax.ShapeDtypeStruct((n, layout.micro, width), dtype, sharding=rows)

    def inputs(n: int) -> tuple:  # prompt, its mask, completion, its log-probs
        return (stacked(n, layout.p_len, jnp.int32), stacked(n, layout.p_len, jnp.float32),
                stacked(n, layout.t_len, jnp.int32), stacked(n, layout.t_len, jnp.float32))

    def values(params, frozen, x):
        return completion_values(nnx.merge(graphdef, params, frozen), *x[:4])

    def micro_loss(params, frozen, x):  # x: inputs, completion mask, returns
        return jnp.sum(jnp.square(values(params, frozen, x) - x[5]) * x[4])

    update_inputs = (*inputs(layout.n_micro), stacked(layout.n_micro, layout.t_len, jnp.float32),
                     stacked(layout.n_micro, layout.t_len, jnp.float32))
    update = mesh_lib.with_activation_layout(mesh, layout.update(micro_loss, tx, shardings))
    update_args, _, update_temp = layout.sizes(jax.jit(
        update, donate_argnums=(0, 1), in_shardings=(shardings, opt_shardings, frozen_shardings, rows),
        out_shardings=(shardings, opt_shardings)), master, opt, frozen, update_inputs)
    passes = layout.batch // layout.micro
    pass_ = mesh_lib.with_activation_layout(mesh, lambda p, f, xs: jax.lax.map(lambda x: values(p, f, x), xs))
    _, values_out, values_temp = layout.sizes(jax.jit(pass_, in_shardings=(shardings, frozen_shardings, rows),
                                                      out_shardings=rows), master, frozen, inputs(passes))
    frozen_b = layout.per_device(frozen)  # the policy's frozen base, shared: an argument, not the critic's own
    params_b = layout.per_device(master)
    compiled = {
        "critic_parameters_and_optimizer_state": update_args - layout.per_device(update_inputs) - frozen_b,
        "critic_update_temporaries": update_temp,
        "critic_values_temporaries": values_temp + values_out,
    }
    analytic = {
        "critic_parameters": params_b,
        "critic_optimizer_state": layout.per_device(opt),
        "critic_gradients": params_b,
        "critic_activations": layout.activation_bytes(config),
        # a critic_path model as loaded (its storage dtype), until the learner's float32 copy exists
        "critic_loaded_model": layout.per_device(placed(nnx.state(abstract, nnx.Param))) if path else 0,
    }
    trainable = sum(int(x.size) for x in jax.tree.leaves(master))
    return trainable, compiled, analytic
