"""A mixture of experts on an expert mesh axis (8 simulated devices) equals one device, and its
compiled programs move tokens, not expert weights; see scripts/expert_mesh.py.

With `training.mesh.expert` > 1 each device holds E / expert of every layer's experts
(rl_models.moe.dispatched_experts): a device sends each of its (token, expert) pairs to the
device holding the expert with an all-to-all, and gets the outputs back with a second one. So
the update and the sampler's decode hold all-to-alls, and no all-gather ever rebuilds an expert
weight's 8 experts (a [8, 64, 48] layer slice) on one device.
"""

from pathlib import Path

import pytest

from simulated_devices import script_result

pytestmark = pytest.mark.multidevice

SCRIPT = Path(__file__).parent / "scripts" / "expert_mesh.py"
MESHES = ["expert8", "fsdp2_expert2_tensor2"]

result = script_result(SCRIPT)


def whole_expert_weight(dims: list[int]) -> bool:
    """An array holding all 8 experts of a [8, 64, 48] gate/up or [8, 48, 64] down kernel slice
    (of a layer, or of the stacked layers)."""
    return any(dims[i:i + 3] in ([8, 64, 48], [8, 48, 64], [8, 32, 48], [8, 64, 24], [8, 24, 64])
               for i in range(len(dims) - 2))


@pytest.mark.parametrize("mesh", MESHES)
def test_two_grpo_steps_match_one_device(result, mesh):
    assert result["device_count"] == 8
    run = result["meshes"][mesh]
    assert run["params_max_abs_diff"] <= 1e-5
    assert run["metrics_max_abs_diff"] <= 1e-4  # losses, KL, grad norms, rewards, lengths
    assert run["same_greedy_tokens"]


@pytest.mark.parametrize("mesh", MESHES)
def test_gpt_oss_form_with_biases_matches_one_device(result, mesh):
    """Random expert biases (the down bias added once, after the sum over tensor), the clamped
    SwiGLU, 15 tokens over 8 row shards (padded in the dispatch)."""
    assert result["meshes"][mesh]["gpt_oss_form_logit_gap"] < 1e-5


def test_expert_weights_split_over_the_expert_axis(result):
    # [layers, E, D, F]: expert=8 gives each device one expert of each layer, whole otherwise
    assert result["meshes"]["expert8"]["gate_shape"] == [2, 8, 64, 48]
    assert result["meshes"]["expert8"]["gate_shard"] == [2, 1, 64, 48]
    # 2 experts ways, D over fsdp 2, F over tensor 2
    assert result["meshes"]["fsdp2_expert2_tensor2"]["gate_shard"] == [2, 4, 32, 24]


@pytest.mark.parametrize("mesh", MESHES)
@pytest.mark.parametrize("program", ["update", "decode"])
def test_tokens_are_dispatched_with_all_to_all(result, mesh, program):
    run = result["meshes"][mesh]
    # two per layer forward (there and back), two layers scanned: the ops appear in the loop's body
    assert run[program]["kinds"].get("all-to-all", 0) >= 2, run[program]["kinds"]


@pytest.mark.parametrize("mesh", MESHES)
@pytest.mark.parametrize("program", ["update", "decode"])
def test_no_all_gather_rebuilds_the_experts(result, mesh, program):
    gathered = result["meshes"][mesh][program]["all_gathers"]
    assert not [dims for dims in gathered if whole_expert_weight(dims)], gathered


def test_the_decode_on_expert8_gathers_only_the_dense_weights(result):
    """With fsdp=1 the expert axis is the only one sharding the dense weights (embed split 8 ways, as
    fsdp would): the decode gathers those, and nothing with an experts axis at all."""
    gathered = result["meshes"]["expert8"]["decode"]["all_gathers"]
    assert gathered  # the dense weights (embedding, attention), as an fsdp mesh gathers them
    assert not [dims for dims in gathered if 8 in dims[:2] and 48 in dims], gathered
