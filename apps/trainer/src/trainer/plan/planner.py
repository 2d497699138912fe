"""`trainer plan`: will a run fit, and how much of each device does each part take?

Nothing is loaded and nothing runs: the model is built with `nnx.eval_shape`
(only config.json is read for `--model DIR`), and the run's programs (the
sampler, the reference log-prob pass, the update: the learner's own, see
trainer.plan.programs) are lowered on abstract arrays with the same shardings
the learner uses (rl_core.train.trainable.model_shardings) and compiled for the
requested number of devices (simulated CPU devices: XLA's buffer assignment
gives each program's per-device argument and temporary bytes). Next to them,
a simple analytic count from the parameter shapes and the mesh rules.

Compiled on XLA:CPU, the temporary sizes (activations, KV cache) are those of
the CPU's fusion decisions; on GPU and TPU they differ somewhat, the
parameter, optimizer and cache arrays not at all.

Programs are traced as for the platform planned for (`--platform`, rl_models.attention.traced_for):
`model.attention=auto` resolves for it, and a fused attention kernel that XLA:CPU cannot compile
(cuDNN, Splash) is compiled as a stand-in holding what the kernel holds. The reference pass is
compiled only when beta != 0. What the rollout engine holds (its cache, its weight copy, its
program's temporaries) is the engine's own answer (`Engine.memory`, rl_core.rollout.memory: the
static sampler compiles its program, the paged engine counts its pool, a remote one holds nothing
here); the planner never branches on the engine's name.

The peak is measured against a `trainer.plan.device_memory.MemoryBudget`: the runtime's share of the
device (JAX preallocates 75% of a GPU) less a headroom. The weights as loaded (the model the
learner is built from) are counted where they stay: as the reference (beta != 0), as the frozen
base (LoRA), or, with beta = 0, only at startup, since nothing keeps them once the learner has its
float32 copy (trainer.run.train drops them; tests/trainer/test_trainer_plan.py checks that they go).

A LoRA run (`model.lora.rank` > 0) trains only its adapters: the optimizer
state is theirs, the base is frozen in its storage dtype (or quantized with
`model.quantize`), and the reference policy is the same base with the adapters
off, so the reference copy a full run keeps (with beta > 0) does not exist;
the table states how much that saves.

An algorithm that trains a critic beside the policy (PPO) adds the critic's resident weights
and optimizer state and its two programs, the update and the values pass (trainer.plan.critic).
A run that distills (algorithm.distill_coef > 0) adds its teacher's resident weights and its
log-prob pass (trainer.plan.teacher); each judge model (`judge:`, `rewards:` entries of kind judge)
its resident weights and the program that scores a step's completions (trainer.plan.judge).
The result, its peak and its table are `trainer.plan.result.Plan`. Compiled on a TPU (`trainer bench`
plans on its own backend), a program over the chip's memory is refused by the compiler: that
refusal is raised as `trainer.plan.refusal.ProgramRefused`, whose verdict is one line.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any

from trainer.plan.device_memory import MemoryBudget
from trainer.plan.result import LOADED_MODEL, Plan  # noqa: F401 - the plan's result, importable from here



def simulate_devices(count: int) -> None:
    """Make JAX see `count` CPU devices; must run before JAX starts a backend."""
    from jax._src import xla_bridge

    if xla_bridge.backends_are_initialized():
        import jax

        if jax.device_count() != count:
            raise RuntimeError(f"JAX already started with {jax.device_count()} devices; plan needs {count}")
        return
    flags = [f for f in os.environ.get("XLA_FLAGS", "").split() if "force_host_platform_device_count" not in f]
    os.environ["XLA_FLAGS"] = " ".join([*flags, f"--xla_force_host_platform_device_count={count}"])
    os.environ["JAX_PLATFORMS"] = "cpu"


def planned_config(m: Any) -> tuple[Any, dict[str, Any]]:
    """(TransformerConfig, runtime settings) of model settings `m` as a plan counts them: the
    programs an accelerator would run, by default looping over the layers."""
    from rl_models import CharTokenizer, preset
    from trainer.model_folders import model_config

    runtime = m.runtime() | {"scan_layers": True if m.scan_layers is None else m.scan_layers}
    if m.path:
        return model_config(m.path, **runtime), runtime  # of a URL, config.json alone is fetched
    return preset(m.preset, vocab_size=CharTokenizer().vocab_size, **runtime), runtime


def training_peak(settings: Any, budget: MemoryBudget, *, compiled_programs: dict | None = None,
                  devices: Any = None, kernels: bool = False) -> int:
    """The resident state plus the larger of the update's and the reference pass's temporaries,
    compiled as `plan` compiles them, and nothing else (no rollout engine, critic, teacher or judge):
    what a remat or micro-batch setting changes (trainer.plan.choice), at a compile or two."""
    return _plan(settings, budget, compiled_programs=compiled_programs, devices=devices, kernels=kernels,
                 training_only=True)


def plan(settings: Any, budget: MemoryBudget, *, mean_new_tokens: int | None = None,
         compiled_programs: dict[str, tuple[int, int, int]] | None = None, devices: Any = None,
         kernels: bool = False) -> Plan:
    """The per-device memory of a run with `settings` (a RunSettings) on the current devices,
    for `budget`'s platform and against its limit.

    `mean_new_tokens` (default max_new_tokens) is the mean completion length at which an
    engine's KV in use is counted (the paged engine's: prompts once per group, each completion its own
    tokens rounded up to whole pages. `compiled_programs`, when given, keeps each compiled
    program's sizes by its lowered text, so plans that share a program compile it once. `devices`
    (default this host's) are those the mesh is laid over: a TPU topology's, compiled ahead of time
    with no chip (trainer.plan.tpu_compile), with the platform's real kernels (`kernels`)."""
    return _plan(settings, budget, mean_new_tokens=mean_new_tokens, compiled_programs=compiled_programs,
                 devices=devices, kernels=kernels)


def _plan(settings: Any, budget: MemoryBudget, *, mean_new_tokens: int | None = None,
          compiled_programs: dict | None = None, devices: Any = None, kernels: bool = False,
          training_only: bool = False) -> Any:
    # imported here, not at the top: `trainer plan` imports this module before simulate_devices
    # sets the device count, which must come before anything starts JAX's backend
    import jax
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx
    from rl_core.runtime import mesh as mesh_lib
    from rl_core import registry
    from rl_core.rollout import MemoryQuery, argument_bytes, per_device
    from rl_models import model_class
    from rl_core.policy import frozen as frozen_lib
    from rl_models import attention as attention_lib
    from rl_models.lora import add_adapters, quantize_base
    from rl_models.transformer import compute_dtype
    from trainer.checks import check_attention, check_critic, check_positions, check_tensor_parallel
    from trainer.plan.critic import PolicyLayout, critic_plan, has_critic
    from trainer.plan.experts import expert_rows
    from trainer.plan.programs import policy_programs
    from trainer.plan.refusal import refusals_as_verdicts
    from trainer.plan.judge import judges_plan
    from trainer.plan.kv import kv_query_fields
    from trainer.plan.teacher import teacher_plan

    m = settings.model
    config, runtime = planned_config(m)
    mesh = mesh_lib.training_mesh(settings.training) if devices is None else mesh_lib.make_mesh(
        **settings.training.mesh.to_dict(), devices=list(devices))
    check_tensor_parallel(config, mesh.shape["tensor"])
    check_attention(config, budget.platform)
    check_positions(config, settings.rollout)
    lora = m.lora

    def build():
        model = model_class(config)(config, rngs=nnx.Rngs(0))
        if lora.rank and m.quantize:
            quantize_base(model, m.quantize)
        return add_adapters(model, rank=lora.rank, alpha=lora.alpha, targets=lora.targets) if lora.rank else model

    policy_abstract = nnx.eval_shape(build)
    if has_critic(settings):
        check_critic(settings, policy_abstract)  # model.critic_path: the policy's vocabulary, whole heads
    graphdef, abstract, frozen_abstract, _ = frozen_lib.split_policy(policy_abstract)
    training, rollout = settings.training, settings.rollout
    from rl_core.rollout import resolve_engine

    # "auto" as the trainer's learner resolves it (it has a paged adapter for every model)
    engine_name = resolve_engine(rollout)
    # the learner's own programs, shardings and batch layout, on abstract arrays (trainer.plan.programs)
    programs = policy_programs(settings, mesh, graphdef, abstract, frozen_abstract)
    algo, passes, layout, tx = programs.algo, programs.passes, programs.layout, programs.tx
    group, batch = layout.batch_size // training.prompts_per_step, layout.batch_size
    n_micro, micro = layout.num_micro_batches, layout.micro_size
    p_len, t_len = programs.p_len, programs.t_len
    shardings, master, frozen = programs.shardings, programs.state.params, programs.frozen
    # the weights as loaded (the module's own Params, in their storage dtype)
    stored = jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh),
                          nnx.to_pure_dict(abstract), shardings.params)

    memo = {} if compiled_programs is None else compiled_programs

    def sizes(jitted, *args) -> tuple[int, int, int]:
        """(argument, output, temporary) bytes per device of `jitted` compiled for `args`, traced
        as for the budget's platform."""
        with attention_lib.traced_for(budget.platform, kernels=kernels):
            lowered = jitted.lower(*args)
        key = hashlib.sha256(lowered.as_text().encode()).hexdigest()
        if key not in memo:
            # XLA:TPU refuses a program over the chip's memory where XLA:CPU reports its size
            with refusals_as_verdicts(budget.platform):
                stats = lowered.compile().memory_analysis()
            memo[key] = (stats.argument_size_in_bytes + unread_bytes(lowered, args), stats.output_size_in_bytes,
                         stats.temp_size_in_bytes)
        return memo[key]

    def unread_bytes(lowered, args) -> int:
        """Per-device bytes of the inputs `jax.jit` dropped from the compiled program because it never
        reads them (e.g. each row's prompt where the update reads each group's once): the caller still
        holds them on the device, so the program's arguments count them, as the compiler lays them out."""
        kept = getattr(lowered, "_lowering", None) and lowered._lowering.compile_args.get("kept_var_idx")
        if kept is None:
            return 0
        return argument_bytes([x for i, x in enumerate(jax.tree.leaves(args)) if i not in kept], sizes)

    # the learner's update (rl_core.train.trainable.update_program) of the algorithm's own loss, on one mini-batch
    update_batch = programs.mini_batch(n_micro)
    update_args, _, update_temp = sizes(programs.update, programs.state, frozen, update_batch)

    beta = algo.beta
    ref_args = ref_temp = None
    ref_inputs = programs.pass_inputs(batch // micro)
    if passes.reference:  # a LoRA run's reference is all-zero adapters (float32, adapter-sized) over the same frozen base
        # the learner's log-prob pass (rl_core.train.behaviour.PolicyLogprobs), one micro-batch at a time;
        # its [B, T] log-probs and entropies are allocated as it runs
        ref_args, ref_out, ref_temp = sizes(programs.logprobs, master if lora.rank else stored, frozen, ref_inputs)
        ref_temp += ref_out

    def laid_out(tree: Any) -> int:
        """Bytes of `tree` as the programs' arguments lay it out (XLA:TPU pads to tiles)."""
        return argument_bytes(tree, sizes)

    if training_only:  # resident (as Plan.resident_bytes counts it) + the larger training program
        update_batch_b, ref_batch_b = laid_out(update_batch), laid_out(ref_inputs)
        reference = ref_args - ref_batch_b - laid_out(frozen) if ref_args is not None else 0
        return update_args - update_batch_b + reference + max(update_temp, ref_temp or 0)
    ways = mesh_lib.batch_devices(mesh)

    params_b = per_device(master)
    opt_b = per_device(programs.state.opt_state)
    frozen_b = per_device(frozen)
    ref_b = per_device(master if lora.rank else stored) if beta else 0
    # what a full run's reference copy would take: the whole model in its storage dtype
    whole_model = nnx.eval_shape(lambda: model_class(config)(config, rngs=nnx.Rngs(0)))
    full_stored = jax.tree.map(
        lambda s, sh: jax.ShapeDtypeStruct(s.shape, jnp.dtype(config.param_dtype), sharding=sh),
        nnx.to_pure_dict(nnx.state(whole_model, nnx.Param)),
        nnx.to_pure_dict(mesh_lib.param_shardings(nnx.state(whole_model, nnx.Param), mesh)),
    )
    saved_b = per_device(full_stored) - ref_b if beta and lora.rank else 0
    seq = p_len + t_len
    kernel, auto = (attention_lib.resolve(a, dtype=compute_dtype(config), head_dim=config.head_dim,
                                          platform=budget.platform, length=seq) for a in (config.attention, "auto"))
    kv, recurrent_b = kv_query_fields(config, whole_model, rows=batch, seq=seq, mesh=mesh,
                                      platform=budget.platform)  # trainer.plan.kv
    # what the run's engine holds while it generates, by its own count (rl_core.rollout.memory)
    mean = t_len if mean_new_tokens is None else mean_new_tokens
    held = registry.get_engine(engine_name).memory(MemoryQuery(
        rollout=rollout, graphdef=graphdef, weights=frozen_lib.join(master, frozen),
        variables=nnx.state(whole_model, nnx.Param), mesh=mesh, param_shardings=shardings.whole,
        prompts=training.prompts_per_step, samples=group, batch_size=batch, prompt_tokens=p_len, new_tokens=t_len,
        mean_new_tokens=mean, compiled=sizes, **kv))
    rows_per_device = max(micro // ways, 1)
    tensor = mesh.shape["tensor"]

    def activation_bytes(cfg: Any) -> int:
        """What the backward pass of one micro-batch keeps, per device, over every layer: block
        inputs, q/k/v/attention output, MLP gate/up/activation (split by tensor), float32 attention
        probabilities (split by heads; a fused kernel keeps a float32 log-sum-exp per query and head)."""
        size = jnp.dtype(cfg.dtype).itemsize
        fused = attention_lib.resolve(cfg.attention, dtype=compute_dtype(cfg), head_dim=cfg.head_dim,
                                      platform=budget.platform, length=seq) != "xla"
        kept = (4 * cfg.hidden_size + 3 * cfg.mlp_hidden_size // tensor) * size
        if cfg.remat in ("full", "offload"):  # the layer's input stays (offload keeps the rest on the host)
            kept = cfg.hidden_size * size
        elif cfg.remat != "dots_with_no_batch_dims_saveable":  # that policy lets attention's probabilities go
            kept += cfg.num_heads // tensor * (1 if fused else seq) * 4
        return cfg.num_layers * rows_per_device * seq * kept
    # the compiled column splits the programs' arguments as the compiler lays each part out
    update_batch_b, ref_batch_b, frozen_laid = laid_out(update_batch), laid_out(ref_inputs), laid_out(frozen)
    compiled = {
        # the programs' arguments less their (small) batch inputs
        "parameters_and_optimizer_state": update_args - update_batch_b - frozen_laid,
        "frozen_base": frozen_laid,  # an argument of every program, counted once
        "reference": ref_args - ref_batch_b - frozen_laid if ref_args is not None else 0,
        "update_temporaries": update_temp,
        "rollout_temporaries": None,  # the engine's compiled program, where it measures one
        "reference_temporaries": ref_temp,
    } | held.compiled
    analytic = {
        "parameters": params_b,
        "optimizer_state": opt_b,
        "frozen_base": frozen_b,
        "reference": ref_b,
        "reference_saved": saved_b,
        "gradients": params_b,
        "kv_cache": kv["dense_cache_bytes"],
        "recurrent_state": recurrent_b,
        "activations": activation_bytes(config),
        "loaded_model": per_device(full_stored),  # the whole model in its storage dtype, as it is loaded
    } | held.analytic
    # a mixture of experts: its expert weights and state, dispatch buffers and gathered experts (trainer.plan.experts)
    analytic |= expert_rows(config, mesh, abstract, master, programs.state.opt_state, rows_per_device * seq, per_device)
    critic_trainable = 0
    if has_critic(settings):  # PPO: a second trained model, resident beside the policy, with its own programs
        layout = PolicyLayout(mesh=mesh, runtime=runtime, micro=micro, n_micro=n_micro, batch=batch, p_len=p_len,
                              t_len=t_len, tx=tx, sizes=sizes, per_device=per_device,
                              activation_bytes=activation_bytes, mini_batch=programs.mini_batch)
        critic_trainable, critic_compiled, critic_analytic = critic_plan(settings, build, layout)
        compiled |= critic_compiled
        analytic |= critic_analytic
    teacher_parameters = 0
    if passes.teacher:  # distillation: the teacher's weights, resident, and its log-prob pass (trainer.plan.teacher)
        teacher_parameters, teacher_compiled, teacher_analytic = teacher_plan(
            settings, mesh=mesh, runtime=runtime, layout=layout, inputs=ref_inputs, sizes=sizes, per_device=per_device)
        compiled |= teacher_compiled
        analytic |= teacher_analytic
    # judge models: their weights, resident, and their scoring programs (trainer.plan.judge)
    judge_parameters, judge_compiled, judge_analytic = judges_plan(settings, batch=batch, runtime=runtime,
                                                                   sizes=sizes, per_device=per_device)
    compiled |= judge_compiled
    analytic |= judge_analytic
    trainable = sum(int(np.prod(s.shape)) for s in jax.tree.leaves(master))
    count = sum(int(np.prod(s.shape)) for s in jax.tree.leaves(full_stored)) + (trainable if lora.rank else 0)
    name = m.path or m.preset
    loaded = "frozen_base" if lora.rank else "reference" if beta else "freed"
    return Plan(str(name), dict(mesh.shape), count, trainable, compiled, analytic, budget, engine=engine_name,
                mean_new_tokens=mean, rollout_bytes=held.held_bytes, engine_rows=held.rows, attention=kernel,
                auto_attention=auto, loaded_model=loaded,
                critic_trainable=critic_trainable, teacher_parameters=teacher_parameters,
                judge_parameters=judge_parameters, experts=config.num_experts)
