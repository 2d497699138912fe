"""The update `trainer plan` compiles is the program a run then compiles, to the text: a run's memory
check (trainer.bench.memory_check) compiles the plan's update on abstract arrays, and the run's first
step hands the same jitted program its batch as host arrays (one process, rl_core.runtime.multihost.
program_inputs). Equal modules are one persistent-cache entry, so the first step loads what the check
compiled (on the v5e the 0.5B update took 25-80 s to compile, paid twice before)."""

import numpy as np
import pytest
from flax import nnx
from rl_core.policy import frozen as frozen_lib
from rl_core.runtime import mesh as mesh_lib
from rl_models import Transformer, TransformerConfig
from trainer.plan.programs import policy_programs
from trainer.settings import build_settings


@pytest.mark.parametrize("overrides", [[], ["algorithm.beta=0.04"]], ids=["grpo", "grpo-reference"])
def test_the_update_for_the_plans_abstract_batch_and_a_runs_host_batch_is_one_program(overrides):
    settings = build_settings(algo="grpo", overrides=[
        "training.prompts_per_step=2", "algorithm.group_size=4", "rollout.max_prompt_tokens=7",
        "rollout.max_new_tokens=5", *overrides])
    mesh = mesh_lib.training_mesh(settings.training)
    abstract = nnx.eval_shape(lambda: Transformer(TransformerConfig.tiny(32), rngs=nnx.Rngs(0)))
    graphdef, params, frozen, _ = frozen_lib.split_policy(abstract)
    programs = policy_programs(settings, mesh, graphdef, params, frozen)
    planned = programs.mini_batch(programs.layout.num_micro_batches)  # sharded ShapeDtypeStructs
    host = _host(planned)  # numpy, as a run passes them

    def text(batch):
        return programs.update.trace(programs.state, programs.frozen, batch).lower().as_text()

    assert text(host) == text(planned)


def _host(tree):
    """Zeros of `tree`'s shapes and dtypes as numpy arrays (a NamedTuple of them, or one)."""
    if hasattr(tree, "_fields"):
        return type(tree)(*(None if x is None else _host(x) for x in tree))
    return np.zeros(tree.shape, tree.dtype)
