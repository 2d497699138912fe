"""The static sampler's window rings on 4 simulated CPU devices (fsdp=2 x tensor=2).

Run with XLA_FLAGS=--xla_force_host_platform_device_count=4 (set before jax is imported). Prints
one JSON line: each cache leaf's shape and its shard on one device as the sampler lays it out
(rl_models' `decode_cache_axes` through the rules table), whether the compiled program holds the
rings at their per-device shape, and whether greedy and sampled completions on the mesh equal those
of one device. Model: the tiny Gemma 3 fixture with its layers scanned (a ring stack of five 4-slot
layers, a global stack of one).
"""

import json
from pathlib import Path

import jax
import numpy as np
from flax import nnx

from rl_core.policy.protocols import decode_cache
from rl_core.policy.tokens import left_pad
from rl_core.rollout.sampler import GREEDY, Sampler, SamplingParams
from rl_core.runtime import mesh as mesh_lib
from rl_models.hf import load_hf_model

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "hf" / "gemma3_text"
T = 12


def measure(devices) -> dict:
    mesh = mesh_lib.make_mesh(data=1, fsdp=2, tensor=2, devices=devices)
    model = load_hf_model(FIXTURE, scan_layers=True)
    graphdef, state = nnx.split(model)
    shardings = nnx.to_pure_dict(mesh_lib.param_shardings(state, mesh))
    params = jax.device_put(nnx.to_pure_dict(state), shardings)
    rng = np.random.default_rng(0)
    tokens, mask = left_pad([rng.integers(3, 300, n).tolist() for n in (3, 14, 9, 6)], pad_id=0, max_tokens=16)
    key = jax.random.key(0)

    on_mesh = Sampler(graphdef, max_new_tokens=T, eos_ids=(10_000,), pad_id=0, mesh=mesh, param_shardings=shardings)
    alone = Sampler(graphdef, max_new_tokens=T, eos_ids=(10_000,), pad_id=0)
    cache, axes = decode_cache(model, 8, 16 + T)  # the 4 prompts' 2 samples each
    layout = jax.tree.map(lambda x, names: [list(x.shape), list(mesh_lib.logical_sharding(
        tuple(names), x.shape, mesh).shard_shape(x.shape))], cache, axes)
    text = on_mesh._jit(True, True).lower(params, tokens, mask, key, GREEDY, 2).compile().as_text()
    greedy = on_mesh(params, tokens, mask, key, GREEDY, 2), alone(nnx.to_pure_dict(state), tokens, mask, key, GREEDY, 2)
    sampled = (on_mesh(params, tokens, mask, key, SamplingParams(temperature=0.7), 2),
               alone(nnx.to_pure_dict(state), tokens, mask, key, SamplingParams(temperature=0.7), 2))
    return {
        "device_count": len(devices),
        "ring_layout": layout.ring[0],
        "full_layout": layout.full[0],
        "program_holds_ring_shards": "f32[5,4,1,4,16]" in text,
        "program_holds_whole_rings": "f32[5,8,2,4,16]" in text,
        "same_greedy_as_one_device": bool(np.array_equal(greedy[0].tokens, greedy[1].tokens)),
        "same_sampled_as_one_device": bool(np.array_equal(sampled[0].tokens, sampled[1].tokens)),
        "sampled_logp_gap": float(np.abs(np.asarray(sampled[0].logp) - np.asarray(sampled[1].logp)).max()),
    }


def main() -> None:
    print(json.dumps(measure(jax.devices())))


if __name__ == "__main__":
    main()
