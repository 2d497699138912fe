"""A committed tiny fixture on a simulated-device mesh (fsdp=2, tensor=2), as the mesh scripts of
this folder measure it: the model loaded whole and sharded, the largest logit gap of the sharded
forward (under the activation layout) to the forward on one device, and whether the static
sampler on the mesh generates the greedy tokens transformers generated."""

from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from safetensors.numpy import load_file

from rl_core.rollout.sampler import GREEDY, Sampler
from rl_core.runtime import mesh as mesh_lib
from rl_models.hf import load_hf_model, load_hf_tokenizer

HF = Path(__file__).resolve().parents[1] / "fixtures" / "hf"


def param_specs(model: Any, mesh: Any) -> dict[str, Any]:
    """Each parameter's PartitionSpec ("layers/attn/q_proj/kernel": spec) on `mesh` (an AbstractMesh
    does) as the runtime places it (rl_core.runtime.mesh.param_shardings), of an abstract or real model."""
    shardings = mesh_lib.param_shardings(nnx.state(model, nnx.Param), mesh)
    return {"/".join(map(str, path)): v.get_value().spec for path, v in nnx.to_flat_state(shardings)}


def measure_on_mesh(name: str, devices: Any, **axes: int) -> tuple[Any, dict]:
    """(the sharded model, {device_count, logit_gap, same_greedy_as_transformers}) of fixture `name`
    on a mesh of `axes` (make_mesh's sizes; fsdp=2, tensor=2 when none are given)."""
    mesh = mesh_lib.make_mesh(devices=devices, **({"data": 1, "fsdp": 2, "tensor": 2} | axes))
    ref = load_file(str(HF / "reference" / f"{name}.safetensors"))
    alone = load_hf_model(HF / name)
    sharded = load_hf_model(HF / name, shardings=lambda state: mesh_lib.param_shardings(state, mesh))
    ids, positions = jnp.asarray(ref["input_ids"]), jnp.asarray(ref["position_ids"])
    valid = ref["attention_mask"] > 0
    length = ids.shape[1]
    mask = jnp.tril(jnp.ones((length, length), bool))[None] & jnp.asarray(valid)[:, None, :]

    def forward(model, ids, positions, mask):
        hidden, _ = model(ids, positions, mask)
        return model.logits(hidden)

    one = np.asarray(jax.jit(forward)(alone, ids, positions, mask))
    on_mesh = np.asarray(jax.jit(mesh_lib.with_activation_layout(mesh, forward))(sharded, ids, positions, mask))
    tok = load_hf_tokenizer(HF / name)
    graphdef, state = nnx.split(sharded)
    shardings = jax.tree.map(lambda x: x.sharding, state)
    sampler = Sampler(graphdef, max_new_tokens=10, eos_ids=tok.eos_ids, pad_id=tok.pad_id, mesh=mesh,
                      param_shardings=shardings)
    out = sampler(state, np.asarray(ref["prompt_ids"]), np.asarray(ref["prompt_mask"]), jax.random.key(0), GREEDY)
    return sharded, {
        "device_count": len(devices),
        "logit_gap": float(np.abs(on_mesh - one)[valid].max()),
        "same_greedy_as_transformers": bool((np.asarray(out.tokens) == ref["greedy_ids"]).all()),
    }
