"""`trainer plan` for a run that distills (`algorithm.distill_coef` > 0): the teacher's bytes.

The teacher (trainer.run.teacher) is built as the learner keeps it, on abstract arrays: its Params
in their storage dtype, laid out by the mesh rules, resident for the whole run
(rl_core.train.frozen_model.FrozenModel), and its log-prob pass, the reference pass's program
(rl_core.train.trainable.forward_program of rl_core.train.behaviour.logprob_fn) over the teacher's
weights, one micro-batch at a time. Its model is read from config.json alone (a Hugging Face
folder) or from a run folder's settings (that run's model, at its own dtypes); the adapters of a
LoRA run are not counted (a few per cent of the base at most).

The entries join the plan's `compiled` and `analytic` tables with a "teacher" prefix.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def teacher_config(settings: Any, runtime: dict[str, Any]) -> Any:
    """The TransformerConfig of the run's teacher, without loading a weight."""
    from rl_models import CharTokenizer, preset

    from trainer.model_folders import model_config
    from trainer.run.folder import settings_of_run
    from trainer.run.teacher import is_run_folder

    path = settings.algorithm_config().teacher
    if not is_run_folder(path):
        return model_config(path, **runtime)
    teacher = settings_of_run(path).model
    own = teacher.runtime() | {"scan_layers": runtime["scan_layers"]}
    if teacher.path:
        return model_config(teacher.path, **own)
    return preset(teacher.preset, vocab_size=CharTokenizer().vocab_size, **own)


def teacher_plan(settings: Any, *, mesh: Any, runtime: dict[str, Any], layout: Any, inputs: tuple,
                 sizes: Callable[..., tuple[int, int, int]], per_device: Callable[[Any], int]
                 ) -> tuple[int, dict[str, int], dict[str, int]]:
    """(the teacher's parameter count, its compiled entries, its analytic entries) per device, its pass
    compiled on `inputs` (the reference pass's, trainer.plan.programs.pass_inputs) with the policy's
    batch `layout`."""
    import jax
    from flax import nnx
    from rl_core.rollout import argument_bytes
    from rl_core.runtime import mesh as mesh_lib
    from rl_core.train import logprob_fn
    from rl_core.train import ModelShardings, forward_program
    from rl_models import model_class

    config = teacher_config(settings, runtime)
    graphdef, params, _ = nnx.split(nnx.eval_shape(lambda: model_class(config)(config, rngs=nnx.Rngs(0))), nnx.Param, ...)
    shardings = nnx.to_pure_dict(mesh_lib.param_shardings(params, mesh))
    stored = jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh),
                          nnx.to_pure_dict(params), shardings)
    program = forward_program(graphdef, logprob_fn(settings.rollout), ModelShardings(shardings, {}, None), mesh,
                              packs=layout.packing, shares=True)
    args, out, temp = sizes(program, stored, {}, inputs)
    weights = per_device(stored)
    compiled = {"teacher": args - argument_bytes(inputs, sizes), "teacher_temporaries": temp + out}
    analytic = {"teacher": weights}
    return sum(int(x.size) for x in jax.tree.leaves(stored)), compiled, analytic
