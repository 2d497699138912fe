"""OLMo 3 on a mesh (4 simulated devices, fsdp=2 x tensor=2): the q/k norms over all heads stay
whole on every device while the heads split over tensor, the sharded forward equals one device's,
and the static sampler on the mesh generates what transformers does."""

from pathlib import Path

import pytest

from simulated_devices import script_result

pytestmark = pytest.mark.multidevice

SCRIPT = Path(__file__).parent / "scripts" / "olmo_mesh.py"

result = script_result(SCRIPT, devices=4)


def test_the_norms_over_all_heads_are_whole_on_each_device(result):
    assert result["device_count"] == 4
    # [layers, H * Dh] and [layers, K * Dh]: replicated, as every norm weight
    assert result["norm_shards"] == {"q_norm": [[4, 64], [4, 64]], "k_norm": [[4, 32], [4, 32]]}


def test_sharded_forward_and_sampler_match(result):
    # composite (the split matmuls and the norm's sum over heads add in another order): 1e-4, as
    # the parity tests; measured 1.6e-5
    assert result["logit_gap"] < 1e-4
    assert result["same_greedy_as_transformers"]
