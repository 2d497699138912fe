"""A model with per-sequence state rows on the paged engine over a data mesh of 2 simulated devices
(2 replicas, each with its own page pool and state rows): the completions and log-probs of the
engine on one device. The fixture folder under tests/fixtures/hf is the first argument: qwen35 (its
linear-attention states), gemma3_text (its windowed layers' key/value rings); the second, `tensor`,
lays the devices on the tensor axis instead (one replica, its KV pool and rings split on kv heads).

Run with XLA_FLAGS=--xla_force_host_platform_device_count=2 (set before jax is imported;
tests/support/simulated_devices.py does); prints one JSON line.
"""

import json
import sys
from pathlib import Path

import jax
import numpy as np
from flax import nnx

from rl_core.policy.tokens import left_pad
from rl_core.rollout.backend import Requests
from rl_core.rollout.paged import EngineSettings, PagedBackend
from rl_core.rollout.sampler import SamplingParams
from rl_core.runtime import mesh as mesh_lib
from rl_models import PAGED_TRANSFORMER
from rl_models.hf import load_hf_model

HF = Path(__file__).resolve().parents[2] / "fixtures" / "hf"
SETTINGS = EngineSettings(max_prompt_tokens=16, max_new_tokens=12, page_size=4, slots=3, prefill_chunk=8,
                          steps_per_sync=3)


def measure(devices, name: str = "qwen35", layout: str = "data") -> dict:
    graphdef, state = nnx.split(load_hf_model(HF / name))
    split = (len(devices), 1) if layout == "data" else (1, len(devices))
    mesh = mesh_lib.make_mesh(data=split[0], fsdp=1, tensor=split[1], devices=devices)
    shardings = nnx.to_pure_dict(mesh_lib.param_shardings(state, mesh))
    on_mesh = PagedBackend(graphdef, SETTINGS, paging=PAGED_TRANSFORMER, eos_ids=(10_000,), pad_id=0, mesh=mesh,
                           param_shardings=shardings)
    on_mesh.update_weights(jax.device_put(nnx.to_pure_dict(state), shardings), 1)
    alone = PagedBackend(graphdef, SETTINGS, paging=PAGED_TRANSFORMER, eos_ids=(10_000,), pad_id=0)
    alone.update_weights(nnx.to_pure_dict(state), 1)
    rng = np.random.default_rng(0)
    tokens, mask = left_pad([rng.integers(3, 300, n).tolist() for n in (3, 14, 9, 1)], pad_id=0, max_tokens=16)
    sampled, key = SamplingParams(temperature=1.0), jax.random.key(3)
    a = on_mesh.generate(Requests(tokens, mask, 2), sampled, key)
    b = alone.generate(Requests(tokens, mask, 2), sampled, key)
    return {"replicas": on_mesh.replicas, "state_pool_shapes": [list(x.shape) for x in on_mesh.states],
            "pool_shape": list(on_mesh.pages[0].shape), "pages_in_use": [pool.in_use for pool in on_mesh.pools],
            "state_specs": [[None if a is None else str(a) for a in x.sharding.spec] for x in on_mesh.states],
            "tokens_equal": bool((a.tokens == b.tokens).all()), "logp_max_diff": float(np.abs(a.logp - b.logp).max()),
            "rows_in_use": [pool.in_use for pool in on_mesh.state_pools]}


def main() -> None:
    print(json.dumps(measure(jax.devices(), *sys.argv[1:])))


if __name__ == "__main__":
    main()
