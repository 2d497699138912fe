"""rl_core.mesh: the rules table turns logical axis names into PartitionSpecs for any mesh."""

import pytest
from jax.sharding import AbstractMesh
from jax.sharding import PartitionSpec as P

from rl_core.mesh import MESH_AXES, logical_spec

MESH = AbstractMesh((2, 4, 2), MESH_AXES)  # data 2, fsdp 4, tensor 2 (no devices needed)


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
    single = AbstractMesh((1, 8, 1), MESH_AXES)
    assert logical_spec(("batch", "heads"), (16, 64), single) == P("fsdp", None)


def test_unknown_names_and_wrong_ranks_are_errors():
    with pytest.raises(ValueError, match="no sharding rule for logical axis 'experts'"):
        logical_spec(("experts", "embed"), (8, 64), MESH)
    with pytest.raises(ValueError, match=r"logical axes \('embed',\) do not match shape \(8, 64\)"):
        logical_spec(("embed",), (8, 64), MESH)
