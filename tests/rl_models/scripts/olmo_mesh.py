"""The committed tiny OLMo 3 (norms after the sub-layers, q/k norms over all heads, windowed and
global layers) on 4 simulated CPU devices (fsdp=2, tensor=2).

Run with XLA_FLAGS=--xla_force_host_platform_device_count=4 (set before jax is imported). Prints
one JSON line: the q/k norms' shard shapes as loaded (replicated: each device's heads are normed
over every head's values), the largest logit gap of the sharded forward (under the activation
layout) to the forward on one device, and whether the static sampler on the mesh generates the
greedy tokens transformers generated.
"""

import json

import jax

from fixture_mesh import measure_on_mesh


def measure(devices) -> dict:
    sharded, result = measure_on_mesh("olmo3", devices)
    norms = {}
    for name in ("q_norm", "k_norm"):
        weight = getattr(sharded.layers.attn, name).weight[...]
        norms[name] = [list(weight.shape), list(weight.sharding.shard_shape(weight.shape))]
    return {**result, "norm_shards": norms}


if __name__ == "__main__":
    print(json.dumps(measure(jax.devices()[:4])))
