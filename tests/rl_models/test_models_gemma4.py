"""Gemma 4's text model (rl_models.gemma4) on its committed fixture (tests/fixtures/hf/gemma4_text,
made by tests/fixtures/make_gemma4_fixtures.py with transformers' Gemma4ForCausalLM): 6 layers,
windowed (s s f s s f, window 4) with global layers of their own head size (32) and one KV head
whose keys are its values, the last 2 layers reusing layer 3's and layer 2's keys and values,
per-layer inputs. The logits, packed rows, greedy tokens and export round trip run in the
families' shared tests (test_models_hf_parity, test_models_hf_export); the engines' tokens against
the full forward in tests/rl_core/test_core_engine_families.py. Here: the layout (one cache per
layer that computes keys and values, in both engines) and transformers' greedy tokens from both
engines."""

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl_core.rollout.backend import Requests
from rl_core.rollout.sampler import GREEDY
from rl_models import PAGED_TRANSFORMER
from rl_models.gemma4 import Gemma4Transformer, cache_layers
from rl_models.hf import load_hf_model
from rl_models.rope_types import ProportionalRope
from engines import paged_engine, static_engine

HF = Path(__file__).resolve().parents[1] / "fixtures" / "hf"
NO_EOS = (10_000,)  # transformers' 10 greedy tokens hold no EOS: every completion runs them all


@pytest.fixture(scope="module")
def gemma4():
    return load_hf_model(HF / "gemma4_text")


def test_the_wide_folder_gives_its_sharing_layers_mlps_of_twice_the_width():
    wide = load_hf_model(HF / "gemma4_text_wide")
    assert wide.config.wide_shared_mlp and wide.config.kv_source() == (0, 1, 2, 2, 2, 1)
    assert wide.layers.mlp.up_proj.kernel.shape == (2, 64, 64)  # windowed layers 0 and 2
    assert wide.shared_layers.mlp.up_proj.kernel.shape == (2, 64, 128)  # layers 3 and 4
    assert wide.global_shared_layers.mlp.up_proj.kernel.shape == (1, 64, 128)  # layer 5
    assert wide.global_layers.attn.v_proj.kernel.shape == (1, 64, 2 * 32) and wide.per_layer_embed is None


def test_the_folder_loads_with_global_layers_of_their_own_shape_and_shared_keys_and_values(gemma4):
    cfg = gemma4.config
    assert isinstance(gemma4, Gemma4Transformer)
    assert (cfg.head_dim, cfg.global_head_dim, cfg.num_kv_heads, cfg.global_kv_heads) == (16, 32, 2, 1)
    assert cfg.keys_as_values and cfg.value_norm and cfg.layer_scalars and cfg.query_scale == 1.0
    assert cfg.rope_scaling == ProportionalRope(partial_rotary_factor=0.25) and cfg.rope_local_theta == 1e4
    assert cfg.kv_source() == (0, 1, 2, 3, 3, 2)  # layer 4 reads layer 3's keys and values, layer 5 layer 2's
    assert gemma4.layers.attn.q_proj.kernel.shape == (3, 64, 4 * 16)  # windowed with their own keys: 0, 1, 3
    assert gemma4.global_layers.attn.k_proj.kernel.shape == (1, 64, 1 * 32) and gemma4.global_layers.attn.v_proj is None
    assert gemma4.shared_layers.attn.k_proj is None and gemma4.global_shared_layers.attn.k_proj is None
    assert gemma4.per_layer_embed.shape == (320, 6 * 8) and gemma4.layers.layer_scalar.shape == (3, 1)


def test_one_kv_cache_per_layer_that_computes_keys_and_values_in_both_engines(gemma4):
    """The static cache: 4 buffers for 6 layers (the sharing ones have none), each of its layer's
    shape; the paged engine: the one global layer with its own keys in the pool, at 1 KV head of 32,
    and rings for the 3 windowed ones."""
    assert cache_layers(gemma4.config) == (0, 1, 2, 3)
    ks, vs = gemma4.init_cache(2, 10)
    assert [k.shape for k in ks] == [(2, 2, 10, 16), (2, 2, 10, 16), (2, 1, 10, 32), (2, 2, 10, 16)]
    assert [v.shape for v in vs] == [k.shape for k in ks]
    assert PAGED_TRANSFORMER.cache_spec(gemma4) == (1, 1, 32, jnp.float32)
    keys, values = PAGED_TRANSFORMER.state_spec(gemma4)
    assert keys.shape == values.shape == (3, 4, 2, 16)  # [windowed layers with their own keys, W, K, Dh]


def test_the_cache_holds_the_keys_of_the_call_the_sharing_layers_read(gemma4):
    """Prefilling through the cache gives the logits of the plain forward (the sharing layers
    reading their sources' buffers after the call's keys were written)."""
    ids = jnp.asarray([[5, 17, 42, 99, 130, 7, 8, 9]])
    positions = jnp.arange(8)[None]
    causal = jnp.tril(jnp.ones((8, 8), bool))[None]
    plain, _ = gemma4(ids, positions, causal)
    cache = gemma4.init_cache(1, 12)
    mask = jnp.zeros((1, 8, 12), bool).at[:, :, :8].set(causal)
    cached, _ = gemma4(ids, positions, mask, cache, 0)
    np.testing.assert_allclose(np.asarray(gemma4.logits(cached)), np.asarray(gemma4.logits(plain)), atol=1e-5)


@pytest.mark.parametrize("name", ["gemma4_text", "gemma4_text_wide"])
@pytest.mark.parametrize("engine", ["static", "paged"])
def test_both_engines_generate_transformers_greedy_tokens(gemma4, hf_reference, engine, name):
    """Both fixtures: gemma4_text_wide has three sharing layers with double-wide MLPs and global
    layers with values of their own (make_gemma4_fixtures.py)."""
    arrays, _ = hf_reference(name)
    gemma4 = gemma4 if name == "gemma4_text" else load_hf_model(HF / name)
    want = arrays["greedy_ids"]
    if engine == "static":
        backend = static_engine(gemma4, max_new_tokens=want.shape[1], eos_ids=NO_EOS)
    else:
        backend = paged_engine(gemma4, dict(max_prompt_tokens=16, max_new_tokens=want.shape[1], page_size=4, slots=2,
                                            prefill_chunk=8, steps_per_sync=3), eos_ids=NO_EOS)
    out = backend.generate(Requests(arrays["prompt_ids"], arrays["prompt_mask"]), GREEDY, jax.random.key(0))
    np.testing.assert_array_equal(np.asarray(out.tokens), want)


def test_the_sharding_rules_split_the_per_layer_embedding_like_the_token_embedding():
    """On data 1 x fsdp 4 x tensor 2 the per-layer embedding (at Gemma 4's sizes its largest tensor:
    262144 x 30 * 256) splits as the token embedding does, and the global layers' projections in
    whole heads of their own size."""
    from flax import nnx
    from fixture_mesh import param_specs
    from jax.sharding import AbstractMesh
    from jax.sharding import PartitionSpec as P

    from rl_core.runtime.mesh import MESH_AXES
    from rl_models.hf import load_hf_config

    config = load_hf_config(HF / "gemma4_text")
    abstract = nnx.eval_shape(lambda: Gemma4Transformer(config, rngs=nnx.Rngs(0)))
    specs = param_specs(abstract, AbstractMesh((1, 4, 1, 2), MESH_AXES))
    assert specs["per_layer_embed"] == specs["embed"] == P("tensor", "fsdp")
    assert specs["global_layers/attn/q_proj/kernel"] == P(None, "fsdp", "tensor")  # 4 heads of 32 over 2
