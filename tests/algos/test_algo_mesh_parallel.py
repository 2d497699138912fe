"""GRPO on (data, fsdp, tensor) meshes of 8 simulated devices equals one device.

One subprocess (XLA reads the device count once per process) runs every mesh;
see scripts/mesh_parallel.py.
"""

from pathlib import Path

import pytest

from simulated_devices import script_result
from tolerances import approx

pytestmark = pytest.mark.multidevice

SCRIPT = Path(__file__).parent / "scripts" / "mesh_parallel.py"

result = script_result(SCRIPT)


@pytest.mark.parametrize("mesh", ["1x8x1", "2x2x2", "1x4x2"])
def test_three_grpo_steps_match_one_device(result, mesh):
    assert result["device_count"] == 8
    assert result["moved"] > 1e-2  # the steps learned something, so equal params mean something
    run = result["meshes"][mesh]
    assert run["params_max_abs_diff"] <= 1e-5
    assert run["metrics_max_abs_diff"] <= 1e-4  # losses, KL, grad norms, rewards, lengths
    assert run["same_greedy_tokens"]
    assert run["compiles_steps_2_3"] == 0  # steps 2 and 3 reuse step 1's programs


def test_packed_rows_train_as_padded_rows(result):
    """training.packing: three steps (update, old-policy and reference passes on packed rows,
    packed per device on data 2 x fsdp 2 x tensor 2) equal one device's unpacked run."""
    run = result["packed"]["2x2x2"]
    assert run["params_max_abs_diff"] <= 1e-5
    assert run["metrics_max_abs_diff"] <= 1e-4
    assert run["compiles_steps_2_3"] == 0


def test_fsdp_4_keeps_a_quarter_of_every_large_parameter_and_adam_moment_per_device(result):
    shards = result["fsdp4"]
    large = {path: s for path, s in shards.items() if "norm" not in path}
    assert len(large) == 9  # embed, lm_head and the seven stacked kernels
    for path, s in large.items():
        assert s["param_shard"] == s["mu_shard"] == s["nu_shard"], path
        # exactly one dimension is split four ways, and it is the embed dimension (D = 64)
        split = [(n, k) for n, k in zip(s["shape"], s["param_shard"], strict=True) if n != k]
        assert split == [(64, 16)], (path, s)
        assert s["device0_bytes"] * 4 == s["bytes"], path
    # norm vectors are small and replicated by rule
    assert all(s["param_shard"] == s["shape"] for p, s in shards.items() if "norm" in p)


@pytest.mark.parametrize("family", ["llama3", "qwen2", "qwen3"])
def test_hugging_face_checkpoints_load_into_shards_and_keep_parity(result, family):
    """Loaded straight into shards on a (1, 2, 4) mesh: transformers' logits and greedy
    tokens (through the sharded sampler), no device holding more than 1/8 of a matrix, except
    the k/v projections: the fixtures' 2 KV heads cannot split 4 ways whole, so each is
    replicated on 2 of the tensor devices and only fsdp splits them."""
    run = result["hf_1x2x4"][family]
    assert run["logits_max_abs_diff"] <= 1e-4
    assert run["same_greedy_tokens"]
    assert run["largest_shard_fraction"] == 0.125  # fsdp (2) x tensor (4)
    assert run["kv_shard_fraction"] == [0.5]  # fsdp (2) only


def test_tensor_8_gives_each_device_whole_heads_and_matches_one_device(result):
    """8 query heads, 2 KV heads of 8 on tensor=8: each device holds one whole query head
    (8 columns of q_proj, 8 rows of o_proj) and both KV heads (k_proj replicated, as
    tensor > KV heads); three GRPO steps and greedy tokens equal one device's."""
    run = result["whole_heads_1x1x8"]
    dh = run["head_dim"]
    assert run["q_columns_per_device"] == [dh] and run["o_rows_per_device"] == [dh]
    assert run["k_columns_per_device"] == [2 * dh]
    assert run["params_max_abs_diff"] <= 1e-5
    assert run["same_greedy_tokens"]


@pytest.mark.parametrize("engine", ["static", "paged"])
def test_async_rollouts_on_devices_of_their_own_train_as_on_the_training_devices(result, engine):
    """training.rollout_devices=4: the policy trains on devices 0-3, the next batch is generated
    on devices 4-7 from a copy of the weights moved there, and the run equals the one that
    generates on the training devices, with either rollout engine."""
    run = result["rollouts_apart"][engine]
    assert run["param_devices"] == [0, 1, 2, 3] and run["rollout_weight_devices"] == [4, 5, 6, 7]
    assert run["staleness"] == [0.0, 1.0, 1.0]
    assert run["params_max_abs_diff"] <= 1e-6
    assert run["losses"][0] == approx(run["losses"][1], abs=1e-6)
