"""`trainer plan`: will a run fit, and how much of each device does each part take?

Nothing is loaded and nothing runs: the model is built with `nnx.eval_shape`
(only config.json is read for `--model DIR`), and the run's programs (the
sampler, the reference log-prob pass, the update) are lowered on abstract
arrays with the same shardings the learner uses and compiled for the
requested number of devices (simulated CPU devices: XLA's buffer assignment
gives each program's per-device argument and temporary bytes). Next to them,
a simple analytic count from the parameter shapes and the mesh rules.

Compiled on XLA:CPU, the temporary sizes (activations, KV cache) are those of
the CPU's fusion decisions; on GPU and TPU they differ somewhat, the
parameter, optimizer and cache arrays not at all.

Programs are traced as for the platform planned for (`--platform`, rl_models.attention.traced_for):
`model.attention=auto` resolves for it, and a fused attention kernel that XLA:CPU cannot compile
(cuDNN, Splash) is compiled as a stand-in holding what the kernel holds. The static sampler is
compiled only for a run that uses it, the reference pass only when beta != 0.

The peak is measured against a `trainer.device_memory.MemoryBudget`: the runtime's share of the
device (JAX preallocates 75% of a GPU) less a headroom. The weights as loaded (the model the
learner is built from) are counted where they stay: as the reference (beta != 0), as the frozen
base (LoRA), or, with beta = 0, only at startup, since nothing keeps them once the learner has its
float32 copy (trainer.run drops them; tests/trainer/test_trainer_plan.py checks that they go).

A LoRA run (`model.lora.rank` > 0) trains only its adapters: the optimizer
state is theirs, the base is frozen in its storage dtype (or quantized with
`model.quantize`), and the reference policy is the same base with the adapters
off, so the reference copy a full run keeps (with beta > 0) does not exist;
the table states how much that saves.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import os
from typing import Any

from trainer.device_memory import GIB, MemoryBudget

LOADED_MODEL = {
    "freed": "freed once the learner has its float32 copy (beta = 0: no reference); counted at startup only",
    "reference": "kept as the reference model (beta != 0): counted there",
    "frozen_base": "kept as the frozen base of the adapters (LoRA): counted there",
}
"""Where the weights as loaded go, by Plan.loaded_model."""


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


@dataclasses.dataclass(frozen=True)
class Plan:
    """Per-device bytes of one run, measured (compiled programs) and counted."""

    model: str
    mesh: dict[str, int]
    parameters: int
    """Total parameter count."""
    trainable: int
    """Parameters that train (the adapters of a LoRA run; else every parameter)."""
    compiled: dict[str, int | None]
    """Per-device bytes read from the compiled programs (None: a program the run does not use)."""
    analytic: dict[str, int]
    budget: MemoryBudget
    engine: str = "static"
    """The rollout engine (rollout.engine)."""
    mean_new_tokens: int = 0
    """The mean completion length the paged engine's in-use KV is counted at."""
    attention: str = "xla"
    """The attention kernel model.attention resolves to on the budget's platform."""
    auto_attention: str = "xla"
    """The kernel model.attention=auto would give on the budget's platform."""
    loaded_model: str = "freed"
    """Where the weights as loaded stay (a key of LOADED_MODEL)."""

    @property
    def resident_bytes(self) -> int:
        """What stays on the device between programs: master weights, optimizer state, frozen
        base, reference."""
        c = self.compiled
        return c["parameters_and_optimizer_state"] + c["frozen_base"] + c["reference"]

    @property
    def startup_bytes(self) -> int:
        """While the learner is built: the resident state and, when it is about to be freed, the
        model as loaded."""
        return self.resident_bytes + (self.analytic["loaded_model"] if self.loaded_model == "freed" else 0)

    @property
    def program_bytes(self) -> dict[str, int]:
        """The temporaries of each program the run uses (they run one at a time)."""
        c, a = self.compiled, self.analytic
        # the paged engine holds its pool and its weight copy while it generates
        rollout = c["rollout_temporaries"] if self.engine == "static" else a["engine_kv_pool"] + a["engine_weights"]
        return {"update": c["update_temporaries"], "rollout": rollout, "reference": c["reference_temporaries"] or 0}

    @property
    def peak_bytes(self) -> int:
        """Resident state plus the largest program's temporaries, or the startup, whichever is more."""
        return max(self.resident_bytes + max(self.program_bytes.values()), self.startup_bytes)

    @property
    def fits(self) -> bool:
        return self.peak_bytes <= self.budget.limit_bytes

    @property
    def margin_bytes(self) -> int:
        """The plan's limit less its peak (negative: by how much it does not fit)."""
        return self.budget.limit_bytes - self.peak_bytes

    def table(self) -> str:
        def gib(n: int) -> str:
            return f"{n / GIB:9.2f}"

        a, c = self.analytic, self.compiled
        paged = self.engine == "paged"
        rows = [
            ("parameters (float32) + optimizer state", c["parameters_and_optimizer_state"],
             a["parameters"] + a["optimizer_state"]),
            ("  of which parameters (analytic)", None, a["parameters"]),
            ("frozen base (LoRA)", c["frozen_base"], a["frozen_base"]),
            ("reference model", c["reference"], a["reference"]),
            ("gradients + update activations", c["update_temporaries"], a["gradients"] + a["activations"]),
            ("  of which gradients (analytic)", None, a["gradients"]),
            ("  of which activations, one micro-batch", None, a["activations"]),
            (None if paged else "rollout: KV cache + sampler temporaries", c["rollout_temporaries"], a["kv_cache"]),
            ("rollout engine (paged): KV page pool" if paged else None, None, a["engine_kv_pool"]),
            (f"  in use at a mean of {self.mean_new_tokens} new tokens" if paged else None, None,
             a["engine_kv_in_use"]),
            ("  the static sampler's KV cache would be" if paged else None, None, a["kv_cache"]),
            ("rollout engine: inference weight copy" if paged else None, None, a["engine_weights"]),
            ("reference log-prob pass temporaries" if c["reference_temporaries"] is not None else None,
             c["reference_temporaries"], None),
        ]
        mesh = " x ".join(f"{k}={v}" for k, v in self.mesh.items())
        lora = self.trainable != self.parameters
        trained = f"; {self.trainable:,} trainable ({self.trainable / self.parameters:.2%}, LoRA)" if lora else ""
        lines = [
            f"{self.model}: {self.parameters / 1e9:.2f}B parameters{trained} on mesh {mesh}; "
            f"attention {self.attention} on {self.budget.platform}",
            f"{'per device (GiB)':42s} {'compiled':>9s} {'analytic':>9s}",
        ]
        for name, compiled, analytic in rows:
            if name is not None:
                lines.append(f"{name:42s} {gib(compiled) if compiled is not None else ' ' * 9} "
                             f"{gib(analytic) if analytic is not None else ' ' * 9}")
        lines.append(f"{'peak (resident + largest program)':42s} {gib(self.peak_bytes)}")
        lines.append(f"{'startup (resident + the model as loaded)':42s} {gib(self.startup_bytes)}")
        lines.append(f"the model as loaded ({a['loaded_model'] / GIB:.2f} GiB per device): "
                     f"{LOADED_MODEL[self.loaded_model]}")
        if lora and a["reference_saved"]:
            lines.append(f"reference = the frozen base with adapters off: no second copy of the weights "
                         f"(saves {a['reference_saved'] / GIB:.2f} GiB per device)")
        lines.append(f"memory: {self.budget.describe()}")
        lines.append(self.verdict())
        return "\n".join(lines)

    def verdict(self) -> str:
        peak, limit = self.peak_bytes / GIB, self.budget.limit_bytes / GIB
        if self.fits:
            return f"fits: peak {peak:.2f} of {limit:.2f} GiB (margin {self.margin_bytes / GIB:.2f} GiB)"
        return f"does NOT fit: peak {peak:.2f} GiB is {-self.margin_bytes / GIB:.2f} GiB over the {limit:.2f} GiB limit"

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["budget"] |= {"usable_bytes": self.budget.usable_bytes, "limit_bytes": self.budget.limit_bytes}
        return out | {"device_memory_bytes": self.budget.device_memory_bytes, "peak_bytes": self.peak_bytes,
                      "startup_bytes": self.startup_bytes, "margin_bytes": self.margin_bytes, "fits": self.fits}


def plan(settings: Any, budget: MemoryBudget, *, mean_new_tokens: int | None = None,
         compiled_programs: dict[str, tuple[int, int, int]] | None = None) -> Plan:
    """The per-device memory of a run with `settings` (a RunSettings) on the current devices,
    for `budget`'s platform and against its limit.

    `mean_new_tokens` (default max_new_tokens) is the mean completion length at which the
    paged engine's KV in use is counted: prompts once per group, each completion its own
    tokens rounded up to whole pages. `compiled_programs`, when given, keeps each compiled
    program's sizes by its lowered text, so plans that share a program compile it once."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax
    from flax import nnx
    from rl_core import mesh as mesh_lib
    from rl_core.logprobs import completion_logprobs
    from rl_core.optim import make_optimizer
    from rl_core.sampler import Sampler, SamplingParams
    from rl_models import CharTokenizer, Transformer, preset
    from rl_core import frozen as frozen_lib
    from rl_models import attention as attention_lib
    from rl_models.lora import add_adapters, quantize_base
    from rl_models.transformer import compute_dtype
    from trainer.build import check_attention, check_tensor_parallel, model_config

    m = settings.model
    # the programs an accelerator would run: by default they loop over the layers there
    runtime = m.runtime() | {"scan_layers": True if m.scan_layers is None else m.scan_layers}
    if m.path:
        config = model_config(m.path, **runtime)  # of a URL, config.json alone is fetched
    else:
        config = preset(m.preset, vocab_size=CharTokenizer().vocab_size, **runtime)
    mesh = mesh_lib.training_mesh(settings.training)
    check_tensor_parallel(config, mesh.shape["tensor"])
    check_attention(config, budget.platform)
    kernel, auto = (attention_lib.resolve(a, dtype=compute_dtype(config), head_dim=config.head_dim,
                                          platform=budget.platform) for a in (config.attention, "auto"))
    lora = m.lora

    def build():
        model = Transformer(config, rngs=nnx.Rngs(0))
        if lora.rank and m.quantize:
            quantize_base(model, m.quantize)
        return add_adapters(model, rank=lora.rank, alpha=lora.alpha, targets=lora.targets) if lora.rank else model

    graphdef, abstract, frozen_abstract, _ = frozen_lib.split_policy(nnx.eval_shape(build))
    shardings = nnx.to_pure_dict(mesh_lib.param_shardings(abstract, mesh))
    frozen_shardings = nnx.to_pure_dict(mesh_lib.param_shardings(frozen_abstract, mesh))
    shapes = nnx.to_pure_dict(abstract)
    frozen = jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh),
                          nnx.to_pure_dict(frozen_abstract), frozen_shardings)

    def like(dtype):
        return jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, dtype, sharding=sh), shapes, shardings)

    master, stored = like(jnp.float32), like(jnp.dtype(config.param_dtype))
    group = getattr(settings.algorithm_config(), "group_size", 1)
    training, rollout = settings.training, settings.rollout
    batch = training.prompts_per_step * group
    n_mini, n_micro = training.batch_layout(batch)
    micro = batch // (n_mini * n_micro)
    p_len, t_len = rollout.max_prompt_tokens + 1, rollout.max_new_tokens  # + BOS
    tx = make_optimizer(training, training.num_steps)
    opt_abstract = jax.eval_shape(tx.init, master)
    opt_shardings = optax.tree_map_params(
        tx, lambda _, s: s, opt_abstract, shardings, transform_non_params=lambda _: mesh_lib.replicated(mesh)
    )
    rows = mesh_lib.rows(mesh, axis=1)
    whole = mesh_lib.replicated(mesh)

    def stacked(n: int, width: int, dtype) -> jax.ShapeDtypeStruct:
        return jax.ShapeDtypeStruct((n, micro, width), dtype, sharding=rows)

    def micro_inputs(n: int):
        return (stacked(n, p_len, jnp.int32), stacked(n, p_len, jnp.float32), stacked(n, t_len, jnp.int32),
                stacked(n, t_len, jnp.float32), jax.ShapeDtypeStruct((n, micro), jnp.float32, sharding=rows))

    def micro_loss(params, frozen, xs):
        prompt, prompt_mask, completion, mask, adv = xs
        logp, _ = completion_logprobs(nnx.merge(graphdef, params, frozen), prompt, prompt_mask, completion,
                                      chunk_tokens=rollout.logprob_chunk_tokens)
        return jnp.sum(-adv[:, None] * logp * mask)

    def update(params, opt_state, frozen, xs):
        def body(acc, x):
            g = jax.grad(micro_loss)(params, frozen, x)
            return jax.tree.map(lambda a, b: a + b.astype(jnp.float32), acc, g), None

        zeros = jax.tree.map(jnp.zeros_like, params)
        grads, _ = jax.lax.scan(body, zeros, xs)
        grads = jax.lax.with_sharding_constraint(grads, shardings)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    memo = {} if compiled_programs is None else compiled_programs

    def sizes(jitted, *args) -> tuple[int, int, int]:
        """(argument, output, temporary) bytes per device of `jitted` compiled for `args`, traced
        as for the budget's platform."""
        with attention_lib.traced_for(budget.platform):
            lowered = jitted.lower(*args)
        key = hashlib.sha256(lowered.as_text().encode()).hexdigest()
        if key not in memo:
            stats = lowered.compile().memory_analysis()
            memo[key] = (stats.argument_size_in_bytes, stats.output_size_in_bytes, stats.temp_size_in_bytes)
        return memo[key]

    # traced under the mesh's activation layout, as the learner's programs are (rl_core.mesh)
    update_args, _, update_temp = sizes(jax.jit(
        mesh_lib.with_activation_layout(mesh, update), donate_argnums=(0, 1),
        in_shardings=(shardings, opt_shardings, frozen_shardings, rows),
        out_shardings=(shardings, opt_shardings),
    ), master, opt_abstract, frozen, micro_inputs(n_micro))

    def reference(params, frozen, xs):
        return jax.lax.map(lambda x: micro_loss(params, frozen, x), xs)

    algo = settings.algorithm_config()
    beta = getattr(algo, "beta", 0.0)
    ref_args = ref_temp = None
    if beta:  # a LoRA run's reference is all-zero adapters (float32, adapter-sized) over the same frozen base
        ref_args, _, ref_temp = sizes(jax.jit(mesh_lib.with_activation_layout(mesh, reference),
                                              in_shardings=(shardings, frozen_shardings, rows), out_shardings=whole),
                                      master if lora.rank else stored, frozen, micro_inputs(batch // micro))

    ways = mesh_lib.batch_devices(mesh)
    rollout_temp = None
    if rollout.engine == "static":  # the paged engine's memory is its pool and weight copy (counted below)
        sampler = Sampler(graphdef, max_new_tokens=t_len, eos_ids=(0,), pad_id=0, mesh=mesh,
                          param_shardings=frozen_lib.join(shardings, frozen_shardings))
        u = training.prompts_per_step
        prompts = jax.ShapeDtypeStruct((u, p_len), jnp.int32)
        _, rollout_out, rollout_temp = sizes(
            sampler._jit(u % ways == 0, batch % ways == 0), frozen_lib.join(master, frozen), prompts,
            jax.ShapeDtypeStruct((u, p_len), jnp.float32), jax.random.key(0), SamplingParams.from_rollout(rollout),
            group,
        )
        rollout_temp += rollout_out

    def per_device(tree) -> int:
        total = 0
        for s in jax.tree.leaves(tree):
            shard = s.sharding.shard_shape(s.shape)
            total += math.prod(shard) * jnp.dtype(s.dtype).itemsize
        return total

    params_b = per_device(master)
    opt_b = per_device(jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh),
                                    opt_abstract, opt_shardings))
    frozen_b = per_device(frozen)
    ref_b = per_device(master if lora.rank else stored) if beta else 0
    # what a full run's reference copy would take: the whole model in its storage dtype
    whole_model = nnx.eval_shape(lambda: Transformer(config, rngs=nnx.Rngs(0)))
    full_stored = jax.tree.map(
        lambda s, sh: jax.ShapeDtypeStruct(s.shape, jnp.dtype(config.param_dtype), sharding=sh),
        nnx.to_pure_dict(nnx.state(whole_model, nnx.Param)),
        nnx.to_pure_dict(mesh_lib.param_shardings(nnx.state(whole_model, nnx.Param), mesh)),
    )
    saved_b = per_device(full_stored) - ref_b if beta and lora.rank else 0
    cbytes = jnp.dtype(config.dtype).itemsize
    seq = p_len + t_len
    kv_spec = mesh_lib.logical_spec(("layers", "batch", "kv_heads", "cache_slots", "head_dim"),
                                    (config.num_layers, batch, config.num_kv_heads, seq, config.head_dim), mesh)
    kv_split = math.prod(math.prod(mesh.shape[a] for a in ((x,) if isinstance(x, str) else x))
                         for x in kv_spec if x is not None)
    kv_b = 2 * config.num_layers * batch * config.num_kv_heads * seq * config.head_dim * cbytes // kv_split
    # the paged engine (rl_core.rollout): one replica per data/fsdp device, each with its own page
    # pool split over tensor on kv heads, and weights in the compute dtype split over tensor only
    from rl_core.rollout.factory import engine_settings
    from rl_core.rollout.paged import DECODE_RULES

    replicas = mesh_lib.batch_devices(mesh)
    engine = engine_settings(rollout, batch_size=batch, replicas=replicas)
    tensor_split = mesh.shape["tensor"] if config.num_kv_heads % mesh.shape["tensor"] == 0 else 1
    token_kv_b = 2 * config.num_layers * config.num_kv_heads * config.head_dim * cbytes // tensor_split
    pool_b = engine.pool_pages * engine.page_size * token_kv_b
    mean = t_len if mean_new_tokens is None else mean_new_tokens
    pages = lambda n: -(-n // engine.page_size)  # noqa: E731
    # a replica holds its share of the prompts (dealt round-robin) and their completions
    prompts_here = -(-training.prompts_per_step // replicas)
    in_use_b = (prompts_here * pages(p_len) + prompts_here * group * (pages(mean) + 1)) * engine.page_size * token_kv_b
    whole_state = nnx.state(whole_model, nnx.Param)
    engine_weights_b = sum(
        math.prod(jax.sharding.NamedSharding(mesh, mesh_lib.logical_spec(
            v.get_metadata("out_sharding", None) or (None,) * len(v.shape), v.shape, mesh, DECODE_RULES)
        ).shard_shape(v.shape)) * cbytes
        for v in jax.tree.leaves(whole_state, is_leaf=lambda x: isinstance(x, nnx.Variable))
    )
    rows_per_device = max(micro // ways, 1)
    tensor = mesh.shape["tensor"]
    # what the backward pass keeps per layer: block inputs, q/k/v/attention output, MLP
    # gate/up/activation (split by tensor), float32 attention probabilities (split by heads; a
    # fused kernel keeps a float32 log-sum-exp per query and head instead)
    per_layer = rows_per_device * seq * (
        (4 * config.hidden_size + 3 * config.mlp_hidden_size // tensor) * cbytes
        + config.num_heads // tensor * (seq if kernel == "xla" else 1) * 4
    )
    if config.remat in ("full", "offload"):  # the layer's input stays (offload keeps the rest on the host)
        per_layer = rows_per_device * seq * config.hidden_size * cbytes
    elif config.remat == "dots_with_no_batch_dims_saveable":  # attention's float32 probabilities go
        per_layer = rows_per_device * seq * (4 * config.hidden_size + 3 * config.mlp_hidden_size // tensor) * cbytes
    update_batch_b, ref_batch_b = per_device(micro_inputs(n_micro)), per_device(micro_inputs(batch // micro))
    compiled = {
        # the programs' arguments less their (small) batch inputs
        "parameters_and_optimizer_state": update_args - update_batch_b - frozen_b,
        "frozen_base": frozen_b,  # an argument of every program, counted once
        "reference": ref_args - ref_batch_b - frozen_b if ref_args is not None else 0,
        "update_temporaries": update_temp,
        "rollout_temporaries": rollout_temp,
        "reference_temporaries": ref_temp,
    }
    analytic = {
        "parameters": params_b,
        "optimizer_state": opt_b,
        "frozen_base": frozen_b,
        "reference": ref_b,
        "reference_saved": saved_b,
        "gradients": params_b,
        "kv_cache": kv_b,
        "activations": config.num_layers * per_layer,
        "engine_kv_pool": pool_b,
        "engine_kv_in_use": in_use_b,
        "engine_weights": engine_weights_b,
        "loaded_model": per_device(full_stored),  # the whole model in its storage dtype, as it is loaded
    }
    trainable = sum(int(np.prod(s.shape)) for s in jax.tree.leaves(shapes))
    count = sum(int(np.prod(s.shape)) for s in jax.tree.leaves(full_stored)) + (trainable if lora.rank else 0)
    name = m.path or m.preset
    loaded = "frozen_base" if lora.rank else "reference" if beta else "freed"
    return Plan(str(name), dict(mesh.shape), count, trainable, compiled, analytic, budget, engine=rollout.engine,
                mean_new_tokens=mean, attention=kernel, auto_attention=auto, loaded_model=loaded)
