"""`trainer plan` on a mixture of experts: its expert weights and their optimizer state split over
the expert axis, the dispatch buffers of a layer, and meshes with an expert axis to search."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from jax.sharding import AbstractMesh
from rl_core.runtime.mesh import MESH_AXES
from rl_models import TransformerConfig

from trainer.plan.experts import dispatch_bytes, expert_layouts, gathered_expert_bytes

MOE = Path(__file__).resolve().parents[1] / "fixtures" / "hf" / "qwen3_moe"  # 2 layers, 8 experts of 64 x 32, k = 2
# D = 64, 8 experts of width 48, k = 2, float32
CONFIG = TransformerConfig.tiny(99, num_experts=8, experts_per_token=2, moe_hidden_size=48)


def test_meshes_with_an_expert_axis_split_the_fsdp_devices_largest_first():
    expected = [(f"training.mesh.expert={e}", f"training.mesh.fsdp={8 // e}") for e in (8, 4, 2)]
    assert expert_layouts(128, (1, 8, 1, 1)) == expected
    assert expert_layouts(6, (1, 8, 1, 1)) == [("training.mesh.expert=2", "training.mesh.fsdp=4")]  # 6 experts
    assert expert_layouts(128, (2, 4, 1, 2)) == [(f"training.mesh.expert={e}", f"training.mesh.fsdp={4 // e}")
                                                 for e in (4, 2)]
    assert expert_layouts(128, (1, 4, 2, 1)) == []  # it has one already
    assert expert_layouts(0, (1, 8, 1, 1)) == []  # a dense model


def test_dispatch_buffers_by_hand():
    """10 tokens on a device, k = 2: m = 20 pairs of D = 64 floats."""
    alone = AbstractMesh((1, 8, 1, 1), MESH_AXES)
    # no expert axis: the sorted pairs and their outputs (2 * 20 * 64), and gate, up and their
    # product for the 20 rows (3 * 20 * 48): 4,480 floats
    assert dispatch_bytes(CONFIG, alone, 10) == (2 * 20 * 64 + 3 * 20 * 48) * 4
    # expert = 8: besides those, four all-to-all buffers of 8 slots x 20 rows, and the inner
    # activations of the 160 rows a device runs (its slots from every device): 66,560 floats
    ep8 = AbstractMesh((1, 1, 8, 1), MESH_AXES)
    assert dispatch_bytes(CONFIG, ep8, 10) == ((2 * 20 + 4 * 8 * 20) * 64 + 3 * 160 * 48) * 4
    # tensor = 2 halves the inner width
    ep4_tp2 = AbstractMesh((1, 1, 4, 2), MESH_AXES)
    assert dispatch_bytes(CONFIG, ep4_tp2, 10) == ((2 * 20 + 4 * 4 * 20) * 64 + 3 * 80 * 24) * 4


def test_gathered_expert_weights_fall_with_the_expert_axis():
    layer = 3 * 8 * 64 * 48 * 4  # gate, up and down of the 8 experts, float32
    assert gathered_expert_bytes(CONFIG, AbstractMesh((1, 8, 1, 1), MESH_AXES)) == layer
    assert gathered_expert_bytes(CONFIG, AbstractMesh((1, 2, 4, 1), MESH_AXES)) == layer // 4
    assert gathered_expert_bytes(CONFIG, AbstractMesh((1, 1, 8, 1), MESH_AXES)) == layer // 8


@pytest.mark.multidevice
def test_plan_of_the_tiny_qwen3_moe_on_an_expert_axis_counts_its_experts():
    out = subprocess.run(
        [sys.executable, "-m", "trainer.cli", "plan", "--json", "--model", str(MOE), "--devices", "8",
         "training.mesh.fsdp=1", "training.mesh.expert=8", "training.prompts_per_step=4", "algorithm.group_size=4",
         "training.micro_batch_size=16", "rollout.max_prompt_tokens=8", "rollout.max_new_tokens=8",
         "--device-memory-gb", "80"],
        env=dict(os.environ), capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-4000:]
    result = json.loads(out.stdout)
    analytic = result["analytic"]
    assert result["mesh"] == {"data": 1, "fsdp": 1, "expert": 8, "tensor": 1}
    assert result["experts"] == 8
    # 2 layers x 3 kernels x 8 experts x 64 x 32 float32 masters, one expert of each on a device
    assert analytic["expert_parameters"] == 2 * 3 * 8 * 64 * 32 * 4 // 8
    assert analytic["expert_optimizer_state"] == 2 * analytic["expert_parameters"]  # AdamW's two moments
    # 16 rows of 8 prompt tokens (a BOS among them, as a run encodes prompts) + 8 over 8 devices: 2 x 16 = 32
    # tokens, 64 pairs; four all-to-all buffers of 8 slots of 64 rows
    assert analytic["dispatch_buffers"] == ((2 * 64 + 4 * 8 * 64) * 64 + 3 * 8 * 64 * 32) * 4
    assert analytic["gathered_expert_weights"] == 3 * 1 * 64 * 32 * 4
