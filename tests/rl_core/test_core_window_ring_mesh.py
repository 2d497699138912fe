"""The static sampler's window rings split over rows and KV heads, never over slots, on 4 simulated
devices (fsdp=2 x tensor=2; tests/rl_core/scripts/window_ring_mesh.py), with the completions of one
device."""

from pathlib import Path

import pytest

from simulated_devices import script_result

pytestmark = pytest.mark.multidevice

SCRIPT = Path(__file__).parent / "scripts" / "window_ring_mesh.py"

result = script_result(SCRIPT, devices=4)


def test_rings_split_over_rows_and_kv_heads_never_over_slots(result):
    assert result["device_count"] == 4
    # [windowed layers, rows, KV heads, ring slots, head dim]: 8 rows over fsdp=2, 2 heads over tensor=2
    assert result["ring_layout"] == [[5, 8, 2, 4, 16], [5, 4, 1, 4, 16]]
    assert result["full_layout"] == [[1, 8, 2, 28, 16], [1, 4, 1, 28, 16]]  # the global layer: 16 + 12 slots
    assert result["program_holds_ring_shards"] and not result["program_holds_whole_rings"]


def test_completions_on_the_mesh_equal_one_devices(result):
    assert result["same_greedy_as_one_device"] and result["same_sampled_as_one_device"]
    assert result["sampled_logp_gap"] < 1e-5
