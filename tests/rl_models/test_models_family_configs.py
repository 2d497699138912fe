"""Published config.json files of each family (tests/fixtures/hf_configs, config only) read as the
published models: parameter counts, which layers are windowed, rotary settings.

Counts, by hand (D hidden, F MLP, H/K heads of Dh, V vocab, n layers):
  per layer q, o: D*H*Dh each; k, v: D*K*Dh each; gate, up, down: D*F each; norms: 2D
  (Gemma: 4D + q/k norms 2*Dh); plus V*D embeddings (twice untied) and the final D.
  gemma-3-1b-it  D 1152, F 6912, H 4, K 1, Dh 256, V 262144, n 26, tied: 999,885,952
  gemma-3-4b-it  (text tower, sparse text_config + Gemma3TextConfig defaults) D 2560, F 10240,
                 H 8, K 4, Dh 256, V 262208, n 34, tied: 3,880,263,168
  mistral-7b     D 4096, F 14336, H 32, K 8, Dh 128, V 32000, n 32, untied: 7,241,732,096
  smollm3-3b     D 2048, F 11008, H 16, K 4, Dh 128, V 128256, n 36, tied: 3,075,098,624
  qwen3-8b       D 4096, F 12288, H 32, K 8, Dh 128, V 151936, n 36, untied, q/k norms: 8,190,735,360
  gemma-4-text-defaults  (not a published folder: transformers' Gemma4TextConfig() as it writes it)
                 D 2304, F 9216, H 8, K 4, Dh 256 (global layers 512), V 262144, n 30 (25 windowed,
                 5 global), per-layer inputs P 256, tied. A windowed layer 79,048,449 (q, o 9,437,184;
                 k, v 4,718,592; MLP 63,700,992; 5 norms of D and q/k norms of Dh; gate and projection
                 of P 1,179,648; its layer_scalar), a global one 93,204,737 (q, o 18,874,368; k, v
                 9,437,184; q/k norms of 512); embeddings V*D 603,979,776, per-layer embeddings
                 V*n*P 2,013,265,920, their projection D*n*P 17,694,720 and norm P, the final norm D:
                 5,077,177,886 (transformers' Gemma4ForCausalLM of that config counts the same)
"""

import math
from pathlib import Path

import jax
import pytest
from flax import nnx

from rl_models import Transformer, model_class
from rl_models.hf import load_hf_config
from rl_models.rope_types import LinearRope, YarnRope
from tolerances import approx

CONFIGS = Path(__file__).resolve().parents[1] / "fixtures" / "hf_configs"


@pytest.mark.parametrize(("name", "count"), [
    ("gemma-3-1b-it", 999_885_952), ("gemma-3-4b-it", 3_880_263_168), ("mistral-7b-v0.1", 7_241_732_096),
    ("smollm3-3b", 3_075_098_624), ("qwen3-8b-yarn", 8_190_735_360), ("gemma-4-text-defaults", 5_077_177_886),
])
def test_published_configs_count_the_published_parameters(name, count):
    config = load_hf_config(CONFIGS / name)
    abstract = nnx.eval_shape(lambda: model_class(config)(config, rngs=nnx.Rngs(0)))
    assert sum(x.size for x in jax.tree.leaves(nnx.state(abstract))) == count


def test_gemma3_layers_five_windowed_to_one_global_with_two_thetas():
    one_b = load_hf_config(CONFIGS / "gemma-3-1b-it")
    assert one_b.windowed() == tuple((i + 1) % 6 != 0 for i in range(26))  # layers 6, 12, ... global
    assert (one_b.sliding_window, one_b.rope_theta, one_b.rope_local_theta) == (512, 1e6, 1e4)
    assert one_b.query_scale == 256 ** -0.5 and one_b.hidden_act == "gelu_tanh" and one_b.tie_embeddings
    four_b = load_hf_config(CONFIGS / "gemma-3-4b-it")  # the text tower of a gemma3 folder
    assert four_b.rope_scaling == LinearRope(factor=8.0) and four_b.sliding_window == 1024
    assert (four_b.num_heads, four_b.num_kv_heads, four_b.head_dim, four_b.vocab_size) == (8, 4, 256, 262_208)
    assert sum(four_b.windowed()) == 34 - 5


def test_mistral_windows_every_layer_smollm3_drops_rope_on_every_fourth_qwen3_reads_yarn():
    assert all(load_hf_config(CONFIGS / "mistral-7b-v0.1").windowed())
    smol = load_hf_config(CONFIGS / "smollm3-3b")
    assert smol.nope_layers == tuple(range(3, 36, 4)) and not any(smol.windowed())
    qwen = load_hf_config(CONFIGS / "qwen3-8b-yarn")
    assert qwen.rope_scaling == YarnRope(factor=4.0, original_max_position_embeddings=32768)
    assert qwen.rope_scaling.attention_scale() == approx(0.1 * math.log(4.0) + 1)  # 1.1386


def test_the_sharding_rules_place_every_gemma3_weight():
    """Every parameter of Gemma 3 1B (the post-sub-layer norms, q/k norms included) has logical
    names the rules table maps: on data 1 x fsdp 4 x tensor 2, projections split over fsdp and
    tensor (its single KV head stays whole on tensor), norms are replicated."""
    from fixture_mesh import param_specs
    from jax.sharding import AbstractMesh, PartitionSpec as P

    from rl_core.runtime.mesh import MESH_AXES

    config = load_hf_config(CONFIGS / "gemma-3-1b-it")
    abstract = nnx.eval_shape(lambda: Transformer(config, rngs=nnx.Rngs(0)))
    specs = param_specs(abstract, AbstractMesh((1, 4, 1, 2), MESH_AXES))
    assert specs["layers/attn/q_proj/kernel"] == P(None, "fsdp", "tensor")  # 4 heads of 256 over 2
    assert specs["layers/attn/k_proj/kernel"] == P(None, "fsdp", None)  # 1 KV head: whole
    assert specs["layers/mlp/down_proj/kernel"] == P(None, "tensor", "fsdp")
    for norm in ("attn_norm", "attn_post_norm", "mlp_norm", "mlp_post_norm", "attn/q_norm", "attn/k_norm"):
        assert specs[f"layers/{norm}/weight"] == P(None, None)
    assert specs["embed"] == P("tensor", "fsdp")
