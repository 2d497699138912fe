"""The committed tiny biased Llama (q/k/v/o and gate/up/down biases) on 4 simulated CPU devices
(fsdp=2, tensor=2).

Run with XLA_FLAGS=--xla_force_host_platform_device_count=4 (set before jax is imported). Prints
one JSON line: each bias's shard shape as loaded, the largest logit gap of the sharded forward
(under the activation layout) to the forward on one device, and whether the static sampler on
the mesh generates the greedy tokens transformers generated.
"""

import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from safetensors.numpy import load_file

from rl_core.rollout.sampler import GREEDY, Sampler
from rl_core.runtime import mesh as mesh_lib
from rl_models.hf import load_hf_model, load_hf_tokenizer

HF = Path(__file__).resolve().parents[2] / "fixtures" / "hf"


def measure(devices) -> dict:
    mesh = mesh_lib.make_mesh(data=1, fsdp=2, tensor=2, devices=devices)
    ref = load_file(str(HF / "reference" / "llama_bias.safetensors"))
    alone = load_hf_model(HF / "llama_bias")
    sharded = load_hf_model(HF / "llama_bias", shardings=lambda state: mesh_lib.param_shardings(state, mesh))
    ids, positions = jnp.asarray(ref["input_ids"]), jnp.asarray(ref["position_ids"])
    valid = ref["attention_mask"] > 0
    mask = jnp.tril(jnp.ones((12, 12), bool))[None] & jnp.asarray(valid)[:, None, :]

    def forward(model, ids, positions, mask):
        hidden, _ = model(ids, positions, mask)
        return model.logits(hidden)

    one = np.asarray(jax.jit(forward)(alone, ids, positions, mask))
    on_mesh = np.asarray(jax.jit(mesh_lib.with_activation_layout(mesh, forward))(sharded, ids, positions, mask))
    tok = load_hf_tokenizer(HF / "llama_bias")
    graphdef, state = nnx.split(sharded)
    shardings = jax.tree.map(lambda x: x.sharding, state)
    sampler = Sampler(graphdef, max_new_tokens=10, eos_ids=tok.eos_ids, pad_id=tok.pad_id, mesh=mesh,
                      param_shardings=shardings)
    out = sampler(state, np.asarray(ref["prompt_ids"]), np.asarray(ref["prompt_mask"]), jax.random.key(0), GREEDY)
    shards = {}
    for module, projs in (("attn", ("q_proj", "k_proj", "v_proj", "o_proj")), ("mlp", ("gate_proj", "up_proj",
                                                                                       "down_proj"))):
        for proj in projs:
            bias = getattr(getattr(sharded.layers, module), proj).bias[...]
            shards[proj] = [list(bias.shape), list(bias.sharding.shard_shape(bias.shape))]
    return {
        "device_count": len(devices),
        "bias_shards": shards,
        "logit_gap": float(np.abs(on_mesh - one)[valid].max()),
        "same_greedy_as_transformers": bool((np.asarray(out.tokens) == ref["greedy_ids"]).all()),
    }


if __name__ == "__main__":
    print(json.dumps(measure(jax.devices()[:4])))
