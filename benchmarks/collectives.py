"""The collectives of a Qwen2.5-7B-shaped GRPO-style update on simulated CPU devices.

    uv run python benchmarks/collectives.py [--layers N] [--fsdp 8] [--tensor 1] [--no-layout] [--packed] [--json]

Abstract shapes only (nothing is allocated): bfloat16 compute over float32
master weights, micro-batches of 16 rows of 64 prompt + 704 completion tokens
(two per step), AdamW, compiled for fsdp x tensor CPU devices. Prints each kind
of collective with its executions and bytes per device per optimizer step
(rl_core.hlo), the largest ones, and what FSDP needs by arithmetic: the
bfloat16 weights gathered for the forward and the backward pass of each
micro-batch and the float32 gradients reduce-scattered. Layers run as a scan, as
on accelerators; the totals scale with --layers.

The update traces under rl_core.mesh's activation layout (rows split over the
batch axes, weights gathered), as the learner's does; --no-layout compiles it
without, to show what XLA's partitioner does left alone. --packed feeds the
update packed rows (rl_core.packing: half as many rows of 768 tokens, packed per
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
import optax  # noqa: E402
from flax import nnx  # noqa: E402
from rl_core import frozen as frozen_lib  # noqa: E402
from rl_core import hlo  # noqa: E402
from rl_core import mesh as mesh_lib  # noqa: E402
from rl_core.logprobs import completion_logprobs  # noqa: E402
from rl_core.packing import Packed  # noqa: E402
from rl_models import Transformer, TransformerConfig  # noqa: E402

GIB = 2**30
cfg = TransformerConfig(vocab_size=152064, hidden_size=3584, num_layers=args.layers, num_heads=28, num_kv_heads=4,
                        mlp_hidden_size=18944, attention_bias=True, dtype="bfloat16", param_dtype="bfloat16",
                        scan_layers=True)
problem = cfg.tensor_parallel_problem(args.tensor)
if problem:
    sys.exit(f"--tensor {args.tensor}: {problem}")
mesh = mesh_lib.make_mesh(1, args.fsdp, args.tensor)
graphdef, abstract, _, _ = frozen_lib.split_policy(nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0))))
shardings = nnx.to_pure_dict(mesh_lib.param_shardings(abstract, mesh))
master = jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, jnp.float32, sharding=sh),
                      nnx.to_pure_dict(abstract), shardings)
n_micro, micro, prompt, completion = args.micro_batches, 16, 64, 704
rows = mesh_lib.rows(mesh, axis=1)


def batch(width: int, dtype) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct((n_micro, micro, width), dtype, sharding=rows)


xs = (batch(prompt, jnp.int32), batch(prompt, jnp.float32), batch(completion, jnp.int32),
      batch(completion, jnp.float32), jax.ShapeDtypeStruct((n_micro, micro), jnp.float32, sharding=rows))
if args.packed:  # each device's sequences in half as many rows
    packed_rows = jax.ShapeDtypeStruct((n_micro, micro // 2, prompt + completion), jnp.int32, sharding=rows)
    xs = (*xs, Packed(packed_rows, packed_rows, packed_rows, batch(completion, jnp.int32)))
tx = optax.adamw(1e-6)
opt_abstract = jax.eval_shape(tx.init, master)
opt_shardings = optax.tree_map_params(tx, lambda _, s: s, opt_abstract, shardings,
                                      transform_non_params=lambda _: mesh_lib.replicated(mesh))


def micro_loss(params, x):
    prompt_tokens, prompt_mask, completion_tokens, mask, adv, *packed = x
    logp, _ = completion_logprobs(nnx.merge(graphdef, params, {}), prompt_tokens, prompt_mask, completion_tokens,
                                  packed=packed[0] if packed else None)
    return jnp.sum(-adv[:, None] * logp * mask)


def update(params, opt_state, x):
    def body(acc, micro_batch):
        grads = jax.grad(micro_loss)(params, micro_batch)
        return jax.tree.map(lambda a, g: a + g.astype(jnp.float32), acc, grads), None

    grads, _ = jax.lax.scan(body, jax.tree.map(jnp.zeros_like, params), x)
    grads = jax.lax.with_sharding_constraint(grads, shardings)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state


traced = update if args.no_layout else mesh_lib.with_activation_layout(mesh, update)
compiled = jax.jit(traced, donate_argnums=(0, 1), in_shardings=(shardings, opt_shardings, rows),
                   out_shardings=(shardings, opt_shardings)).lower(master, opt_abstract, xs).compile()
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
