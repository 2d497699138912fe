"""On-policy distillation on meshes of 8 simulated devices equals one device: the teacher's
log-probs (its weights sharded like the student's) and the student's parameters after two steps.
One subprocess runs every mesh; see scripts/distill_mesh.py."""

from pathlib import Path

import pytest

from simulated_devices import script_result

pytestmark = pytest.mark.multidevice

result = script_result(Path(__file__).parent / "scripts" / "distill_mesh.py")


@pytest.mark.parametrize("mesh", ["1x8x1", "2x2x2"])
def test_distillation_on_a_mesh_matches_one_device(result, mesh):
    assert result["device_count"] == 8 and result["one_device_kl"] > 1e-2  # two random models disagree
    run = result["meshes"][mesh]
    assert run["teacher_logp_max_abs_diff"] <= 1e-5
    assert run["params_max_abs_diff"] <= 1e-5
    assert run["kl_abs_diff"] <= 1e-5
    assert run["largest_teacher_shard_fraction"] <= 0.5  # split over fsdp (and tensor), never whole on a device
