"""The committed tiny Qwen3.5 on 4 simulated CPU devices (fsdp=2, tensor=2).

Run with XLA_FLAGS=--xla_force_host_platform_device_count=4 (set before jax is imported). Prints
one JSON line: the layout of the linear-attention weights as loaded, the largest logit gap of the
sharded forward (under the activation layout) to the forward on one device, and whether the static
sampler on the mesh generates the greedy tokens transformers generated.
"""

import json

import jax

from fixture_mesh import measure_on_mesh


def measure(devices) -> dict:
    sharded, result = measure_on_mesh("qwen35", devices)
    kernel = sharded.linear_layers.linear_attn.in_proj_qkv.kernel[...]
    return {**result, "in_proj_qkv_shard": list(kernel.sharding.shard_shape(kernel.shape)),
            "in_proj_qkv_shape": list(kernel.shape)}


if __name__ == "__main__":
    print(json.dumps(measure(jax.devices()[:4])))
