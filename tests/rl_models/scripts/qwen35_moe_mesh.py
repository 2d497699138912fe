"""The committed tiny Qwen3.5-MoE on 4 simulated CPU devices with an expert axis (fsdp=1, expert=2,
tensor=2): each device holds 4 of each layer's 8 experts, in the linear-attention layers' stack and
the attention layers' alike.

Run with XLA_FLAGS=--xla_force_host_platform_device_count=4 (set before jax is imported). Prints
one JSON line: the layout of the experts' gate kernels as loaded, the largest logit gap of the
sharded forward (tokens dispatched to their experts' devices) to the forward on one device, and
whether the static sampler on the mesh generates the greedy tokens transformers generated.
"""

import json

import jax

from fixture_mesh import measure_on_mesh


def measure(devices) -> dict:
    sharded, result = measure_on_mesh("qwen35_moe", devices, data=1, fsdp=1, expert=2, tensor=2)
    layout = {}
    for stack in ("linear_layers", "layers"):
        kernel = getattr(sharded, stack).mlp.gate_proj[...]
        layout[f"{stack}_gate_shape"] = list(kernel.shape)
        layout[f"{stack}_gate_shard"] = list(kernel.sharding.shard_shape(kernel.shape))
    return result | layout


if __name__ == "__main__":
    print(json.dumps(measure(jax.devices()[:4])))
