"""Qwen3.5-MoE on a mesh with an expert axis (4 simulated devices, expert=2 x tensor=2): both
stacks' experts split over the expert axis (and their inner width over tensor), the sharded forward
equals one device's, and the static sampler on the mesh generates what transformers does."""

from pathlib import Path

import pytest

from simulated_devices import script_result

pytestmark = pytest.mark.multidevice

SCRIPT = Path(__file__).parent / "scripts" / "qwen35_moe_mesh.py"

result = script_result(SCRIPT, devices=4)


def test_both_stacks_experts_split_over_the_expert_axis(result):
    assert result["device_count"] == 4
    assert result["linear_layers_gate_shape"] == [3, 8, 64, 32]  # [layers, E, D, F]
    assert result["linear_layers_gate_shard"] == [3, 4, 64, 16]  # E over expert 2, F over tensor 2
    assert result["layers_gate_shard"] == [1, 4, 64, 16]


def test_sharded_forward_and_sampler_match(result):
    # float32 rounding: the experts' down projections summed over tensor in another order (logits of a few units)
    assert result["logit_gap"] < 5e-5
    assert result["same_greedy_as_transformers"]
