"""LoRA under (data, fsdp, tensor) meshes of 8 simulated devices equals one device, and
the frozen base stays sharded. One subprocess (XLA reads the device count once per
process); see scripts/lora_mesh.py."""

from pathlib import Path

import pytest

from simulated_devices import script_result

pytestmark = pytest.mark.multidevice

SCRIPT = Path(__file__).parent / "scripts" / "lora_mesh.py"

result = script_result(SCRIPT)


@pytest.mark.parametrize("mesh", ["1x4x2", "2x2x2"])
def test_three_lora_steps_match_one_device(result, mesh):
    assert result["device_count"] == 8
    assert result["moved"] > 1e-2  # the adapters learned something, so equal adapters mean something
    run = result["meshes"][mesh]
    assert run["adapters_max_abs_diff"] <= 1e-5
    assert run["base_unchanged"]


def test_the_frozen_base_stays_sharded(result):
    # q_proj kernel [layers 2, embed 64, heads 64]: embed split over fsdp=4, heads over tensor=2
    assert result["q_kernel"] == {"shape": [2, 64, 64], "shard": [2, 16, 32]}
