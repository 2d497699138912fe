"""PPO, policy and critic, on a fsdp=2 x tensor=2 mesh of 4 simulated devices equals one device.

One subprocess (XLA reads the device count once per process); see scripts/ppo_mesh.py.
"""

from pathlib import Path

import pytest

from simulated_devices import run_on_simulated_devices

pytestmark = pytest.mark.multidevice

SCRIPT = Path(__file__).parent / "scripts" / "ppo_mesh.py"


def test_two_ppo_steps_on_a_mesh_match_one_device_for_the_policy_and_the_critic():
    result = run_on_simulated_devices(SCRIPT, devices=4)
    assert result["device_count"] == 4
    # both models learned something, so equal parameters mean something
    assert result["moved"]["policy"] > 1e-2 and result["moved"]["critic"] > 1e-2, result["moved"]
    assert result["params_max_abs_diff"]["policy"] <= 1e-5, result
    assert result["params_max_abs_diff"]["critic"] <= 1e-5, result
    # the policy's loss and gradient norm, the critic's value loss, clip fraction and fit, the rewards
    assert {"critic/value_loss", "critic/explained_variance"} <= set(result["critic_metrics"])
    assert result["metrics_max_abs_diff"] <= 1e-4
    # the critic is laid out like the policy: gate_proj [layers 1, embed 32, mlp 64] has embed
    # split over fsdp=2 and mlp over tensor=2
    assert result["critic_gate_kernel"] == {"shape": [1, 32, 64], "shard": [1, 16, 32]}
