"""TransformerConfig validation and presets."""

import dataclasses

import pytest

from rl_models import RopeScaling, TransformerConfig, preset


def test_tiny_presets():
    tiny = TransformerConfig.tiny(50)
    assert (tiny.hidden_size, tiny.num_layers, tiny.num_heads, tiny.num_kv_heads) == (64, 2, 4, 2)
    assert tiny.head_dim == 16 and tiny.mlp_hidden_size == 128
    qwen = preset("tiny_qwen2", vocab_size=99)
    assert (qwen.hidden_size, qwen.num_layers, qwen.num_heads, qwen.num_kv_heads) == (128, 4, 4, 2)
    assert qwen.mlp_hidden_size == 512 and qwen.tie_embeddings and qwen.vocab_size == 99
    assert TransformerConfig.tiny(50, head_dim=8).head_dim == 8


def test_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        TransformerConfig.tiny(50).hidden_size = 3  # type: ignore[misc]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (dict(num_kv_heads=3), r"TransformerConfig.num_kv_heads=3: must divide num_heads \(4\)"),
        (dict(mlp_hidden_size=0), r"TransformerConfig.mlp_hidden_size=0: must be a positive int"),
        (dict(hidden_size=66), r"hidden_size=66: must be divisible by num_heads \(4\)"),
        (dict(head_dim=7), r"head_dim=7: must be a positive even int"),
        (dict(dtype="float16"), r"dtype='float16': must be one of \('float32', 'bfloat16'\)"),
        (dict(rms_norm_eps=0.0), r"rms_norm_eps=0.0: must be > 0"),
        (dict(remat=1), r"remat=1: must be one of"),
        (dict(remat="sometimes"), r"remat='sometimes': must be one of"),
        (dict(scan_layers="auto"), r"scan_layers='auto': must be a bool or None"),
        (dict(rope_scaling={"factor": 8.0}), r"rope_scaling=\{'factor': 8.0\}: must be None, a RopeScaling, LinearRope, YarnRope, DynamicNTKRope, LongRope or ProportionalRope"),
        (dict(sliding_window=0), r"sliding_window=0: must be None or a positive int"),
        (dict(sliding_window=8, layer_types=("full_attention",)), r"layer_types=\('full_attention',\): must name one type per layer \(2\)"),
        (dict(layer_types=("full_attention", "sliding_attention")), r"sliding_attention layers need a sliding_window"),
        (dict(sliding_window=8, layer_types=("full_attention", "local")), r"each must be one of \('full_attention', 'sliding_attention', 'linear_attention'\)"),
        (dict(nope_layers=(2,)), r"nope_layers=\(2,\): must be layer indices below 2"),
        (dict(hidden_act="relu"), r"hidden_act='relu': must be one of \('silu', 'gelu_tanh'\)"),
        (dict(query_scale=0.0), r"query_scale=0.0: must be None or > 0"),
    ],
)
def test_validation_names_field_value_and_rule(overrides, message):
    with pytest.raises(ValueError, match=message):
        TransformerConfig.tiny(50, **overrides)


def test_vocab_size_validation():
    with pytest.raises(ValueError, match=r"TransformerConfig.vocab_size=0: must be a positive int"):
        TransformerConfig.tiny(0)


def test_rope_scaling_validation():
    ok = RopeScaling(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                     original_max_position_embeddings=8192)
    assert TransformerConfig.tiny(50, rope_scaling=ok).rope_scaling == ok
    with pytest.raises(ValueError, match=r"high_freq_factor=1.0: must be > low_freq_factor \(1.0\)"):
        RopeScaling(factor=8.0, low_freq_factor=1.0, high_freq_factor=1.0,
                    original_max_position_embeddings=8192)


def test_unknown_preset_suggests_the_closest():
    with pytest.raises(ValueError, match=r"unknown model preset 'tiny_qwen'.*Did you mean 'tiny_qwen2'"):
        preset("tiny_qwen", vocab_size=50)


@pytest.mark.parametrize(("overrides", "message"), [
    (dict(kv_shared_layers=2), r"kv_shared_layers=2: must leave a layer|each shared layer needs an earlier layer"),
    (dict(layer_types=("full_attention", "sliding_attention"), sliding_window=4, kv_shared_layers=1),
     r"kv_shared_layers=1: each shared layer needs an earlier layer of its type"),
    (dict(global_kv_heads=3), r"global_kv_heads=3: must divide num_heads \(4\)"),
    (dict(global_head_dim=33), r"global_head_dim=33: must be even"),
])
def test_gemma4_fields_are_validated_in_one_line(overrides, message):
    with pytest.raises(ValueError, match=message):
        TransformerConfig.tiny(64, **overrides)


def test_a_shared_layer_reads_the_last_earlier_layer_of_its_type():
    config = TransformerConfig.tiny(64, num_layers=6, sliding_window=4, kv_shared_layers=3,
                                    layer_types=("sliding_attention", "full_attention", "sliding_attention") * 2)
    assert config.layered and config.kv_source() == (0, 1, 2, 2, 1, 2)
    assert not TransformerConfig.tiny(64).layered
