"""rl_core.runtime.mesh: the rules table turns logical axis names into PartitionSpecs for any mesh."""

import pytest
from jax.sharding import AbstractMesh
from jax.sharding import PartitionSpec as P

from rl_core.runtime.mesh import MESH_AXES, logical_spec

MESH = AbstractMesh((2, 4, 1, 2), MESH_AXES)  # data 2, fsdp 4, expert 1, tensor 2 (no devices needed)


def test_parameters_split_embed_over_fsdp_and_heads_mlp_vocab_over_tensor():
    assert logical_spec(("layers", "embed", "heads"), (28, 1536, 1536), MESH) == P(None, "fsdp", "tensor")
    assert logical_spec(("layers", "mlp", "embed"), (28, 8960, 1536), MESH) == P(None, "tensor", "fsdp")
    assert logical_spec(("vocab", "embed"), (151936, 1536), MESH) == P("tensor", "fsdp")
    assert logical_spec(("layers", "norm"), (28, 1536), MESH) == P(None, None)


def test_rows_split_over_data_and_fsdp_and_the_kv_cache_over_rows_and_kv_heads():
    cache = ("layers", "batch", "kv_heads", "cache_slots", "head_dim")
    assert logical_spec(cache, (28, 64, 2, 768, 128), MESH) == P(None, ("data", "fsdp"), "tensor", None, None)


def test_a_dimension_the_devices_do_not_divide_stays_whole_or_partly_split():
    assert logical_spec(("vocab", "embed"), (99, 64), MESH) == P(None, "fsdp")  # 99 rows: not split by 2
    assert logical_spec(("batch",), (6,), MESH) == P("data")  # 6 rows: data (2) divides, data x fsdp (8) not
    assert logical_spec(("batch",), (3,), MESH) == P(None)


def test_a_mesh_axis_is_used_once_per_array_and_size_1_axes_are_dropped():
    # a toy cache laid out (batch, slots, embed): fsdp already splits the rows
    assert logical_spec(("batch", "cache_slots", "embed"), (8, 16, 64), MESH) == P(("data", "fsdp"), None, None)
    single = AbstractMesh((1, 8, 1, 1), MESH_AXES)
    assert logical_spec(("batch", "heads"), (16, 64), single) == P("fsdp", None)


def test_unknown_names_and_wrong_ranks_are_errors():
    with pytest.raises(ValueError, match="no sharding rule for logical axis 'widgets'"):
        logical_spec(("widgets", "embed"), (8, 64), MESH)
    with pytest.raises(ValueError, match=r"logical axes \('embed',\) do not match shape \(8, 64\)"):
        logical_spec(("embed",), (8, 64), MESH)


def test_fused_head_axes_split_only_in_whole_heads():
    """Qwen2.5-7B: 28 query heads and 4 KV heads of 128, fused [3584] and [512] axes."""
    tensor8 = AbstractMesh((1, 1, 1, 8), MESH_AXES)
    tensor4 = AbstractMesh((1, 1, 1, 4), MESH_AXES)
    # 3584 columns divide by 8, but 28 heads do not: whole heads only, so the axis stays whole
    assert logical_spec(("embed", "heads"), (3584, 3584), tensor8) == P(None, "tensor")
    assert logical_spec(("embed", "heads"), (3584, 3584), tensor8, units=(1, 128)) == P(None, None)
    assert logical_spec(("embed", "heads"), (3584, 3584), tensor4, units=(1, 128)) == P(None, "tensor")  # 7 each
    # 4 KV heads over 8 devices: replicated (each device holds all 4), never half a head
    assert logical_spec(("embed", "kv_heads"), (3584, 512), tensor8, units=(1, 128)) == P(None, None)
    assert logical_spec(("embed", "kv_heads"), (3584, 512), tensor4, units=(1, 128)) == P(None, "tensor")
    # the KV cache holds the heads unfused: 4 heads over 8 devices stay whole too
    cache = ("layers", "batch", "kv_heads", "cache_slots", "head_dim")
    assert logical_spec(cache, (28, 64, 4, 768, 128), tensor8) == P(None, None, None, None, None)
    with pytest.raises(ValueError, match=r"axis units \(1, 100\) do not divide shape \(64, 3584\)"):
        logical_spec(("embed", "heads"), (64, 3584), tensor8, units=(1, 100))


def test_a_lane_packed_cache_splits_only_in_whole_128_lane_groups():
    """rl_models.block.LaneKV [layers, B, S, K x Dh]: Qwen2.5-0.5B's 2 heads of 64 are one group of 128
    lanes, which 2 tensor devices do not split (the heads' layout would give each a head; a group split
    in half would be re-gathered for every decode step's products); Llama 3.2 1B's 8 heads of 64 are 4
    groups, 2 a device."""
    cache = ("layers", "batch", "cache_slots", "kv_lanes")
    assert logical_spec(cache, (24, 64, 288, 128), MESH) == P(None, ("data", "fsdp"), None, None)
    assert logical_spec(cache, (16, 64, 288, 512), MESH) == P(None, ("data", "fsdp"), None, "tensor")


def test_model_parameters_carry_whole_head_units():
    from flax import nnx
    from rl_models import Transformer, TransformerConfig
    from rl_models.lora import add_adapters

    model = add_adapters(Transformer(TransformerConfig.tiny(11, attention_bias=True), rngs=nnx.Rngs(0)), rank=2,
                         alpha=4.0)
    attn, dh = model.layers.attn, model.config.head_dim
    assert attn.q_proj.kernel.get_metadata("axis_units") == (1, 1, dh)  # layers, embed, heads
    assert attn.k_proj.bias.get_metadata("axis_units") == (1, dh)
    assert attn.o_proj.kernel.get_metadata("axis_units") == (1, dh, 1)
    assert attn.q_proj.lora_b.get_metadata("axis_units") == (1, 1, dh)
    assert model.layers.mlp.up_proj.kernel.get_metadata("axis_units") == (1, 1, 1)


def test_tensor_parallel_problems_name_the_heads_and_what_fits():
    from rl_models import TransformerConfig

    qwen7b = TransformerConfig(vocab_size=11, hidden_size=3584, num_layers=1, num_heads=28, num_kv_heads=4,
                               mlp_hidden_size=64)
    assert qwen7b.tensor_parallel_problem(1) is None
    assert qwen7b.tensor_parallel_problem(4) is None  # 7 query heads and 1 KV head each
    assert qwen7b.tensor_parallel_problem(2) is None
    assert qwen7b.tensor_parallel_problem(8) == (
        "8 devices cannot each hold whole query heads of the model's 28; tensor parallelism over "
        "[1, 2, 4, 28] devices can")
    wide = TransformerConfig(vocab_size=11, hidden_size=96, num_layers=1, num_heads=24, num_kv_heads=4,
                             mlp_hidden_size=64)
    assert wide.tensor_parallel_problem(8) is None  # 3 query heads each, each KV head on 2 devices
    assert wide.tensor_parallel_problem(6) == (
        "the model's 4 KV heads neither split evenly over 6 devices nor replicate evenly on them "
        "(use a divisor or a multiple of 4)")


def test_the_expert_axis_splits_experts_rows_and_the_other_weights_embed():
    """Qwen3-30B-A3B's shapes on fsdp 2 x expert 4 x tensor 2: an expert kernel [layers, 128, 2048,
    768] takes `expert` on its experts (32 each), fsdp on embed and tensor on its width; a dense
    weight's embed is split over fsdp and expert both (expert is one more fsdp axis outside the
    experts), and rows over data, fsdp and expert."""
    mesh = AbstractMesh((1, 2, 4, 2), MESH_AXES)
    assert logical_spec(("layers", "experts", "embed", "mlp"), (48, 128, 2048, 768), mesh) == P(
        None, "expert", "fsdp", "tensor")
    assert logical_spec(("layers", "embed", "heads"), (48, 2048, 4096), mesh) == P(None, ("fsdp", "expert"), "tensor")
    assert logical_spec(("batch",), (64,), mesh) == P(("fsdp", "expert"))
    # 6 experts do not divide over 4 devices: whole, and the embed axis takes expert instead
    assert logical_spec(("layers", "experts", "embed", "mlp"), (48, 6, 2048, 768), mesh) == P(
        None, None, ("fsdp", "expert"), "tensor")
