"""The update `trainer plan` compiles is the program a run then compiles, to the text: a run's memory
check (trainer.bench.memory_check) compiles the plan's update on abstract arrays, and the run's first
step hands the same jitted program its batch as host arrays (one process, rl_core.runtime.multihost.
program_inputs). Equal modules are one persistent-cache entry, so the first step loads what the check
compiled (on the v5e the 0.5B update took 25-80 s to compile, paid twice before). The same for the
sampler's program."""

import jax
import numpy as np
import pytest
from flax import nnx
from rl_core.policy import frozen as frozen_lib
from rl_core.rollout.memory import MemoryQuery, static_memory
from rl_core.rollout.sampler import Sampler, SamplingParams
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


def test_the_sampler_the_memory_check_compiles_is_the_one_a_run_compiles():
    """The memory check compiles the sampler before the tokenizer is read (placeholder end and pad
    ids, abstract weights and prompts); the run's sampler has the tokenizer's ids and real arrays.
    The ids are the program's arguments, not constants, so the two are one module: the run's
    first rollout loads the check's compile (tiny-qwen2: 3.0 s of compiling gone from the first step)."""
    settings = build_settings(algo="grpo", overrides=[
        "training.prompts_per_step=2", "algorithm.group_size=4", "rollout.max_prompt_tokens=7",
        "rollout.max_new_tokens=5"])
    mesh = mesh_lib.training_mesh(settings.training)
    model = Transformer(TransformerConfig.tiny(32), rngs=nnx.Rngs(0))
    graphdef, state = nnx.split(model)
    shardings = nnx.to_pure_dict(mesh_lib.param_shardings(nnx.state(model, nnx.Param), mesh))
    weights = jax.device_put(nnx.to_pure_dict(state), shardings)
    abstract = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), weights, shardings)
    texts = []

    def compiled(jitted, *args):
        texts.append(jitted.lower(*args).as_text())  # the sampler, then a program that only holds its prompts
        return 0, 0, 0

    static_memory(MemoryQuery(
        rollout=settings.rollout, graphdef=graphdef, weights=abstract, variables=None, mesh=mesh,
        param_shardings=shardings, prompts=2, samples=4, batch_size=8, prompt_tokens=7, new_tokens=5,
        mean_new_tokens=5, num_kv_heads=1, kv_token_bytes=0, compute_bytes=4, dense_cache_bytes=0, compiled=compiled))
    run = Sampler(graphdef, max_new_tokens=5, eos_ids=(5, 7), pad_id=3, mesh=mesh, param_shardings=shardings)
    prompts = np.ones((2, 7), np.int32)
    texts.append(run._jit(True, True).lower(weights, prompts, np.ones((2, 7), np.float32), jax.random.key(1),
                                            SamplingParams.from_rollout(settings.rollout), 4).as_text())
    assert len(texts) == 3 and texts[0].startswith("module @jit__traced") and texts[0] == texts[2]
