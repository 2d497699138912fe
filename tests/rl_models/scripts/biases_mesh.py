"""The committed tiny biased Llama (q/k/v/o and gate/up/down biases) on 4 simulated CPU devices
(fsdp=2, tensor=2).

Run with XLA_FLAGS=--xla_force_host_platform_device_count=4 (set before jax is imported). Prints
one JSON line: each bias's shard shape as loaded, the largest logit gap of the sharded forward
(under the activation layout) to the forward on one device, and whether the static sampler on
the mesh generates the greedy tokens transformers generated.
"""

import json

import jax

from fixture_mesh import measure_on_mesh


def measure(devices) -> dict:
    sharded, result = measure_on_mesh("llama_bias", devices)
    shards = {}
    for module, projs in (("attn", ("q_proj", "k_proj", "v_proj", "o_proj")), ("mlp", ("gate_proj", "up_proj",
                                                                                       "down_proj"))):
        for proj in projs:
            bias = getattr(getattr(sharded.layers, module), proj).bias[...]
            shards[proj] = [list(bias.shape), list(bias.sharding.shard_shape(bias.shape))]
    return {**result, "bias_shards": shards}


if __name__ == "__main__":
    print(json.dumps(measure(jax.devices()[:4])))
