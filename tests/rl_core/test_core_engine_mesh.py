"""The paged engine on 8 simulated devices with fsdp=8: its decode step gathers no weight.

The master weights are split over fsdp (each device holds an eighth of every
large parameter); the engine's bfloat16 copy is whole on every device, made by
one refresh program that holds the only all-gathers. Each device is one engine
replica with its own page pool, decoding its own share of the prompts. The static sampler, which
decodes from the master weights, is the contrast: its program gathers them.
"""

from pathlib import Path

import pytest

from simulated_devices import script_result

from rl_core.runtime import hlo

pytestmark = pytest.mark.multidevice

SCRIPT = Path(__file__).parent / "scripts" / "engine_mesh.py"

result = script_result(SCRIPT)


def test_decode_step_has_no_weight_all_gather(result):
    assert result["device_count"] == 8
    assert result["step_all_gathers"] == []
    # one scalar all-reduce per call (does any replica prefill?), nothing per token or weight
    assert result["step"] == {"all-reduce": 1}
    assert result["step_collective_elements"] == [1]
    # the helper does see gathers where there are some: the sampler on fsdp-split master weights
    assert result["static_sampler"].get("all-gather", 0) > 0
    assert result["static_sampler_gathered_elements"] > 0


def test_one_refresh_program_reshards_and_casts(result):
    assert result["refresh"].get("all-gather", 0) > 0  # the one transfer: fsdp shards -> whole copies
    assert result["weight_dtypes"] == ["bfloat16"]
    assert result["weights_replicated"]
    assert result["weight_bytes"] * 2 == result["master_bytes"]  # bfloat16 copy of float32 masters


def test_one_engine_replica_per_device(result):
    # 8 replicas, each its own pool on its own device: a device decodes only its share of the prompts
    assert result["replicas"] == 8
    assert result["pool_shape"][0] == 8
    assert result["pool_shard_shape"] == [1, *result["pool_shape"][1:]]


def test_same_completions_on_the_mesh_as_on_one_device(result):
    assert result["same_greedy_as_one_device"]
    assert result["same_sampled_as_one_device"]
    assert result["sampled_logp_gap"] < 1e-5  # the same arithmetic per row, vmapped over replicas or not
    assert result["pages_free_after"]


def test_a_continued_sequence_is_decoded_by_the_replica_holding_it(result):
    assert result["continued_same_as_one_device"]
    assert result["continued_logp_gap"] < 1e-5
    # every prefix token but those of the cut turn's last token and the observation was held
    assert 0 < result["continued_reused_tokens"] <= result["continued_prefix_tokens"]


def test_hlo_helper_reads_kinds_shapes_and_async_pairs():
    text = """
  %all-gather.1 = f32[8,64]{1,0} all-gather(f32[1,64]{1,0} %p0), channel_id=1, replica_groups={{0,1}}
  %ars = (bf16[4,2]{1,0}, bf16[4,2]{1,0}) all-reduce-start(bf16[4,2]{1,0} %x), to_apply=%add
  %ard = bf16[4,2]{1,0} all-reduce-done((bf16[4,2]{1,0}, bf16[4,2]{1,0}) %ars)
  %add.3 = f32[8,64]{1,0} add(f32[8,64]{1,0} %a, f32[8,64]{1,0} %b)
"""
    assert hlo.count(text) == {"all-gather": 1, "all-reduce": 1}
    assert [c.elements for c in hlo.collectives(text)] == [512, 8]


def test_partial_rollouts_switch_every_replica_at_once(result):
    """rollout.partial_rollouts = recompute on the 8 replicas: new weights published after the first
    call decode every replica's following calls; tokens before it are the unswitched run's."""
    assert result["partial_switches"] == 1 and result["partial_versions"] == [1, 2]
    assert result["partial_versions_in_order"]
    assert result["partial_old_tokens"] > 0 and result["partial_old_tokens_as_unswitched"]
    assert result["partial_pages_free_after"]
