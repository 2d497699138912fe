"""The collectives of the learner's update of GRPO's loss, on a Qwen2.5-7B shape, on simulated CPU devices.

    uv run python benchmarks/collectives.py [--layers N] [--fsdp 8] [--tensor 1] [--no-layout] [--packed] [--json]

The program is the learner's own: rl_core.train.trainable.update_program (the jitted
make_update) of GRPO's loss as its learner binds it (rl_core.train.objective.policy_loss_function,
GRPO's default config: beta 0.04, so the mini-batch carries reference log-probs), with
the shardings a TrainableModel computes (rl_core.train.trainable.model_shardings) and the run's
default optimizer (rl_core.train.optim.make_optimizer: AdamW after global-norm clipping).
Abstract shapes only (nothing is allocated): bfloat16 compute over float32
master weights, micro-batches of 16 rows of 64 prompt + 704 completion tokens
(two per step; 2 rows per device on fsdp=8, fewer than a group of 8, so prompts are
not shared), compiled for fsdp x tensor CPU devices. Prints each kind
of collective with its executions and bytes per device per optimizer step
(rl_core.runtime.hlo), the largest ones, and what FSDP needs by arithmetic: the
bfloat16 weights gathered for the forward and the backward pass of each
micro-batch and the float32 gradients reduce-scattered. Layers run as a scan, as
on accelerators; the totals scale with --layers.

The update traces under rl_core.runtime.mesh's activation layout (rows split over the
batch axes, weights gathered), as the learner's does; --no-layout compiles the same
make_update without it, to show what XLA's partitioner does left alone. --packed feeds the
update packed rows (rl_core.train.packing: half as many rows of 768 tokens, packed per
device) as training.packing does. --json prints one JSON
object instead (tests/rl_core/test_core_collectives.py reads it).
"""

import argparse
import json
import os
import sys

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--layers", type=int, default=2)
parser.add_argument("--fsdp", type=int, default=8)
parser.add_argument("--tensor", type=int, default=1)
parser.add_argument("--micro-batches", type=int, default=2)
parser.add_argument("--no-layout", action="store_true", help="no activation layout (the partitioner's guess)")
parser.add_argument("--packed", action="store_true", help="packed rows (training.packing)")
parser.add_argument("--json", action="store_true")
args = parser.parse_args()
devices = args.fsdp * args.tensor
os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={devices}"

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402
from rl_core.policy import frozen as frozen_lib
from rl_core import (
    make_optimizer, Packed, policy_loss_function, registry, RolloutConfig, TrainExample, TrainingConfig,
)
from rl_core.runtime import hlo, mesh as mesh_lib
from rl_core.train import abstract_model, make_update, model_shardings, update_program
from rl_models import Transformer, TransformerConfig  # noqa: E402

GIB = 2**30
cfg = TransformerConfig(vocab_size=152064, hidden_size=3584, num_layers=args.layers, num_heads=28, num_kv_heads=4,
                        mlp_hidden_size=18944, attention_bias=True, dtype="bfloat16", param_dtype="bfloat16",
                        scan_layers=True)
problem = cfg.tensor_parallel_problem(args.tensor)
if problem:
    sys.exit(f"--tensor {args.tensor}: {problem}")
mesh = mesh_lib.make_mesh(1, args.fsdp, args.tensor)
graphdef, abstract, frozen_abstract, _ = frozen_lib.split_policy(
    nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0))))
n_micro, micro, prompt, completion = args.micro_batches, 16, 64, 704
tx = make_optimizer(TrainingConfig(), total_updates=1)
shardings = model_shardings(abstract, frozen_abstract, tx, mesh)  # as the TrainableModel's
state, frozen = abstract_model(abstract, frozen_abstract, tx, shardings)
master = state.params
grpo = registry.get_algorithm("grpo").config()
loss_fn = policy_loss_function(grpo, RolloutConfig(max_prompt_tokens=prompt, max_new_tokens=completion),
                               beta=grpo.beta)
rows = mesh_lib.rows(mesh, axis=1)


def batch(width: int, dtype) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct((n_micro, micro, width), dtype, sharding=rows)


# one mini-batch as the learner's GRPO feeds it: on-policy (no behaviour log-probs), the
# reference's and the sampler's log-probs
packed = None
if args.packed:  # each device's sequences in half as many rows
    packed_rows = jax.ShapeDtypeStruct((n_micro, micro // 2, prompt + completion), jnp.int32, sharding=rows)
    packed = Packed(packed_rows, packed_rows, packed_rows, batch(completion, jnp.int32))
xs = TrainExample(
    prompt_tokens=batch(prompt, jnp.int32), prompt_mask=batch(prompt, jnp.float32),
    completion_tokens=batch(completion, jnp.int32), completion_mask=batch(completion, jnp.float32),
    advantages=jax.ShapeDtypeStruct((n_micro, micro), jnp.float32, sharding=rows),
    ref_logp=batch(completion, jnp.float32), sampler_logp=batch(completion, jnp.float32), packed=packed,
)
if args.no_layout:  # the same make_update and shardings, traced without the activation layout
    program = jax.jit(make_update(graphdef, tx, loss_fn, shardings.params), donate_argnums=0,
                      in_shardings=(shardings.state, shardings.frozen, rows),
                      out_shardings=(shardings.state, mesh_lib.replicated(mesh)))
else:
    program = update_program(graphdef, tx, loss_fn, shardings, mesh)  # the learner's update_step
compiled = program.lower(state, frozen, xs).compile()
ops = hlo.collectives(compiled.as_text())
elements = sum(int(np.prod(s.shape)) for s in jax.tree.leaves(master))
need = n_micro * 2 * elements * 2 / args.tensor + elements * 4 / args.tensor  # bf16 gathers + f32 reduce-scatter
if args.json:
    # per-device shapes a parameter's gradient may be reduced at: its layer's slice, split over
    # tensor only (FSDP's split is what the reduction produces), either way round
    whole_over_fsdp = {**mesh_lib.RULES, "embed": None}
    param_shapes = set()
    for var in jax.tree.leaves(abstract, is_leaf=lambda x: isinstance(x, nnx.Variable)):
        names = var.get_metadata("out_sharding", None) or (None,) * len(var.shape)
        spec = mesh_lib.logical_spec(names, var.shape, mesh, whole_over_fsdp, var.get_metadata("axis_units", None))
        shard = jax.sharding.NamedSharding(mesh, spec).shard_shape(var.shape)
        shard = shard[1:] if names[0] == "layers" else shard
        param_shapes.update({tuple(shard), tuple(reversed(shard))})
    rows_per_device = micro // mesh_lib.batch_devices(mesh)
    print(json.dumps({
        "total_bytes": hlo.total_bytes(ops), "fsdp_needs_bytes": need,
        "summary": hlo.summary(ops),
        "all_reduce_arrays": [[list(dims), size] for c in ops if c.kind == "all-reduce" for dims, size in hlo.arrays(c)],
        "all_gather_arrays": [[list(dims), size] for c in ops if c.kind == "all-gather" for dims, size in hlo.arrays(c)],
        "param_shapes": sorted(map(list, param_shapes)),
        "one_layer_activation_bytes": rows_per_device * (prompt + completion) * cfg.hidden_size * 4,
    }))
    sys.exit(0)
print(f"Qwen2.5-7B shape, {args.layers} layers ({elements / 1e9:.2f}B parameters), fsdp={args.fsdp} "
      f"tensor={args.tensor}, {n_micro} micro-batches of {micro} x {prompt + completion} tokens")
for kind, row in hlo.summary(ops).items():
    print(f"  {kind:18s} {row['executions']:5d} executions  {row['bytes'] / GIB:8.2f} GiB per device per step")
print(f"  total {hlo.total_bytes(ops) / GIB:.2f} GiB; FSDP needs about {need / GIB:.2f} GiB")
print("largest:")
for c in sorted(ops, key=lambda c: -c.bytes * c.count)[:8]:
    print(f"  {c.kind:18s} x{c.count:<3d} {c.bytes / 2**20:9.1f} MiB  {', '.join(c.shapes)[:90]}")
