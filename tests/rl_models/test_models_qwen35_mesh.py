"""Qwen3.5 on a mesh (4 simulated devices, fsdp=2 x tensor=2): the sharding rules place the
linear-attention weights (split over fsdp on their input axis, whole over tensor), the sharded
forward equals one device's, and the static sampler on the mesh generates what transformers does."""

from pathlib import Path

import pytest

from simulated_devices import script_result

pytestmark = pytest.mark.multidevice

SCRIPT = Path(__file__).parent / "scripts" / "qwen35_mesh.py"

result = script_result(SCRIPT, devices=4)


def test_linear_attention_weights_split_over_fsdp_whole_over_tensor(result):
    assert result["device_count"] == 4
    assert result["in_proj_qkv_shape"] == [3, 64, 128]
    assert result["in_proj_qkv_shard"] == [3, 32, 128]  # D = 64 over fsdp = 2; the 128 channels whole


def test_sharded_forward_and_sampler_match(result):
    assert result["logit_gap"] < 1e-5
    assert result["same_greedy_as_transformers"]
