"""The bias flags of the dense families (`attention_bias`: q, k, v and o_proj; `mlp_bias`: gate, up
and down) load where transformers puts the biases and compute what transformers computes.

References: tests/fixtures/make_hf_fixtures.py (`build_biased`), transformers 5.25.0 float32 eager
attention, the biases drawn N(0, 0.1^2). llama_bias and smollm3_bias set both flags, qwen3_bias
and gemma3_text_bias attention_bias (the flags their transformers configs have).
"""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from rl_core.rollout.backend import Requests
from rl_core.rollout.sampler import GREEDY
from rl_models import Transformer, TransformerConfig
from rl_models.hf import HFFolderError, export_hf, load_hf_config, load_hf_model
from safetensors.numpy import load_file

from engines import full_forward_greedy, paged_engine, static_engine
from tolerances import close

BIASED = ("llama_bias", "qwen3_bias", "smollm3_bias", "gemma3_text_bias", "qwen3_moe_bias")
FAMILY = {"llama_bias": "llama", "qwen3_bias": "qwen3", "smollm3_bias": "smollm3", "gemma3_text_bias": "gemma3_text",
          "qwen3_moe_bias": "qwen3_moe"}
MLP_BIASED = ("llama_bias", "smollm3_bias")


def _logits(model, ids, positions, mask):
    hidden, _ = jax.jit(lambda m: m(jnp.asarray(ids), jnp.asarray(positions), mask))(model)
    return np.asarray(model.logits(hidden))


def _padded_logits(model, arrays):
    valid = np.asarray(arrays["attention_mask"], bool)
    mask = jnp.tril(jnp.ones((12, 12), bool))[None] & jnp.asarray(valid)[:, None, :]
    return _logits(model, arrays["input_ids"], arrays["position_ids"], mask), valid


@pytest.mark.parametrize("name", BIASED)
def test_biases_load_where_transformers_puts_them(name, hf_fixtures):
    """Every bias tensor of the folder fills the projection of the same name, and only those
    projections have one (Llama-style attention_bias: o_proj too, unlike Qwen2's)."""
    config = load_hf_config(hf_fixtures / name)
    mlp = name in MLP_BIASED
    assert (config.attention_bias, config.attention_out_bias, config.mlp_bias) == (True, True, mlp)
    model = load_hf_model(hf_fixtures / name)
    tensors = load_file(str(hf_fixtures / name / "model.safetensors"))
    biases = sorted(k for k in tensors if k.endswith(".bias"))
    projections = ["k_proj", "o_proj", "q_proj", "v_proj"] + (["down_proj", "gate_proj", "up_proj"] if mlp else [])
    assert len(biases) == 2 * len(projections)  # two layers
    for key in biases:
        layer, module, proj = key.split(".")[2], key.split(".")[3], key.split(".")[4]
        assert proj in projections
        ours = getattr(getattr(model.layers, "attn" if module == "self_attn" else "mlp"), proj).bias[...]
        np.testing.assert_array_equal(np.asarray(ours[int(layer)]), tensors[key].astype(np.float32), err_msg=key)
    if not mlp and not config.num_experts:
        assert model.layers.mlp.gate_proj.bias is None


@pytest.mark.parametrize("name", BIASED)
def test_logits_match_transformers_left_padded_and_packed(name, hf_fixtures, hf_reference):
    arrays, _ = hf_reference(name)
    model = load_hf_model(hf_fixtures / name)
    logits, valid = _padded_logits(model, arrays)
    np.testing.assert_allclose(logits[valid], arrays["logits"][valid], **close(atol=1e-4, rtol=1e-4, of="model logits"))
    segments = jnp.asarray(arrays["packed_segments"])
    mask = jnp.tril(jnp.ones((12, 12), bool))[None] & (segments[:, :, None] == segments[:, None, :])
    packed = _logits(model, arrays["packed_ids"], arrays["packed_positions"], mask)
    np.testing.assert_allclose(packed, arrays["packed_logits"], **close(atol=1e-4, rtol=1e-4, of="model logits"))


@pytest.mark.parametrize("name", BIASED)
def test_greedy_generation_matches_transformers_token_for_token(name, hf_fixtures, hf_reference, greedy_generate):
    arrays, meta = hf_reference(name)
    model = load_hf_model(hf_fixtures / name)
    want = arrays["greedy_ids"]
    got = greedy_generate(model, arrays["prompt_ids"], arrays["prompt_mask"], want.shape[1], meta["eos_ids"],
                          meta["pad_id"])
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize(("name", "zeroed"), [("llama_bias", ("q_proj", "k_proj", "v_proj")),
                                              ("llama_bias", ("o_proj",)),
                                              ("llama_bias", ("gate_proj", "up_proj", "down_proj")),
                                              ("gemma3_text_bias", ("o_proj",))])
def test_each_bias_is_exercised(name, zeroed, hf_fixtures, hf_reference):
    """With those biases zeroed the logits move by far more than the tolerance: the parity test
    above really checks them (o_proj's bias is the one Qwen2's layout would drop)."""
    arrays, _ = hf_reference(name)
    model = load_hf_model(hf_fixtures / name)
    for proj in zeroed:
        module = model.layers.attn if proj in ("q_proj", "k_proj", "v_proj", "o_proj") else model.layers.mlp
        lin = getattr(module, proj)
        lin.bias[...] = jnp.zeros_like(lin.bias[...])
    logits, valid = _padded_logits(model, arrays)
    assert np.abs(logits[valid] - arrays["logits"][valid]).max() > 1e-2


ENGINE_NAMES = ["llama_bias", *(pytest.param(n, marks=pytest.mark.e2e) for n in BIASED[1:])]


def _prompts():
    rng = np.random.default_rng(0)
    rows = [rng.integers(3, 300, n).tolist() for n in (3, 14, 9, 6)]
    width = max(map(len, rows))
    tokens = np.asarray([[0] * (width - len(r)) + r for r in rows], np.int32)
    mask = np.asarray([[0] * (width - len(r)) + [1] * len(r) for r in rows], np.int32)
    return tokens, mask


@pytest.mark.parametrize("name", ENGINE_NAMES)
@pytest.mark.parametrize("engine", ["static", "paged"])
def test_both_engines_generate_what_the_full_forward_predicts(name, engine, hf_fixtures):
    """The static sampler's fused decode projections and the paged engine's own block add each
    bias as the full forward does (12 tokens past prompts of up to 14)."""
    model = load_hf_model(hf_fixtures / name)
    tokens, mask = _prompts()
    no_eos = (10_000,)
    if engine == "static":
        backend = static_engine(model, max_new_tokens=12, eos_ids=no_eos)
    else:
        backend = paged_engine(model, dict(max_prompt_tokens=16, max_new_tokens=12, page_size=4, slots=3,
                                           prefill_chunk=8, steps_per_sync=3), eos_ids=no_eos)
    out = backend.generate(Requests(tokens, mask), GREEDY, jax.random.key(0))
    assert np.asarray(out.tokens).shape == (4, 12)
    np.testing.assert_array_equal(np.asarray(out.tokens), full_forward_greedy(model, tokens, mask, out.tokens))


@pytest.mark.parametrize("name", BIASED)
def test_export_writes_the_biases_back(name, hf_fixtures, hf_reference, tmp_path):
    """With the source folder and without it (config.json written from the model's config: its
    family and bias flags inferred), the exported folder loads back to the same parameters and
    the reference logits (tests/fixtures/check_hf_export.py checks transformers loads them too)."""
    arrays, meta = hf_reference(name)
    model = load_hf_model(hf_fixtures / name)
    for out in (export_hf(model, tmp_path / "own"), export_hf(model, tmp_path / "src", source_dir=hf_fixtures / name)):
        written = json.loads((out / "config.json").read_text())
        assert written["model_type"] == FAMILY[name] == meta["model_type"]
        assert written["attention_bias"] is True and written.get("mlp_bias", False) is (name in MLP_BIASED)
        assert sorted(load_file(str(out / "model.safetensors"))) == meta["weight_keys"]
        again = load_hf_model(out)
        assert again.config == model.config
        logits, valid = _padded_logits(again, arrays)
        np.testing.assert_allclose(logits[valid], arrays["logits"][valid], **close(atol=1e-4, rtol=1e-4, of="model logits"))


@pytest.mark.parametrize(("name", "changes", "message"), [
    ("mistral", dict(attention_bias=True), r"unsupported attention_bias=True: mistral's attention has no biases in "
                                           r"transformers \(families with attention_bias: gemma2, gemma3, gemma3_text, llama, "
                                           r"qwen3, qwen3_moe, smollm3\)"),
    ("qwen3", dict(mlp_bias=True), r"unsupported mlp_bias=True: qwen3's MLP has no biases in transformers "
                                   r"\(families with mlp_bias: llama, smollm3\)"),
    ("gemma3_text", dict(mlp_bias=True), r"unsupported mlp_bias=True: gemma3_text's MLP"),
    ("qwen2", dict(mlp_bias=True), r"unsupported mlp_bias=True: qwen2's MLP"),
])
def test_bias_flags_a_family_lacks_stay_refused(name, changes, message, hf_copy):
    folder = hf_copy(name)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(config | changes))
    with pytest.raises(HFFolderError, match=message):
        load_hf_config(folder)


@pytest.mark.parametrize(("overrides", "message"), [
    (dict(attention_bias=True, attention_out_bias=True, sliding_window=8), "mistral has no attention biases"),
    (dict(attention_out_bias=True), "llama's attention_bias puts biases on q, k, v and o_proj together"),
    (dict(mlp_bias=True, qk_norm=True), r"qwen3 has no MLP biases \(only llama's and smollm3's mlp_bias\)"),
    (dict(mlp_bias=True, attention_bias=True), "qwen2 has no MLP biases"),
])
def test_export_refuses_biases_no_family_has(overrides, message, tmp_path):
    model = Transformer(TransformerConfig.tiny(40, **overrides), rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match=message):
        export_hf(model, tmp_path / "out")


def test_mlp_bias_is_the_dense_mlps():
    with pytest.raises(ValueError, match=r"TransformerConfig.mlp_bias=True: is the dense MLP's"):
        TransformerConfig.tiny(40, mlp_bias=True, num_experts=4, experts_per_token=2, moe_hidden_size=16)


def test_each_bias_shards_like_its_projections_output():
    """The rules table places each new bias as its kernel's output axis (data 2, fsdp 4, tensor 2):
    q/k/v biases over whole heads on `tensor`, gate/up over `tensor`, o_proj and down_proj (outputs
    of width D) over `fsdp`; every bias is a parameter `trainer plan` counts."""
    from jax.sharding import AbstractMesh
    from jax.sharding import PartitionSpec as P
    from rl_core.runtime.mesh import MESH_AXES, logical_spec

    mesh = AbstractMesh((2, 4, 1, 2), MESH_AXES)
    config = TransformerConfig.tiny(40, attention_bias=True, attention_out_bias=True, mlp_bias=True)
    model = nnx.eval_shape(lambda: Transformer(config, rngs=nnx.Rngs(0)))
    want = {("attn", "q_proj"): P(None, "tensor"), ("attn", "k_proj"): P(None, "tensor"),
            ("attn", "v_proj"): P(None, "tensor"), ("attn", "o_proj"): P(None, "fsdp"),
            ("mlp", "gate_proj"): P(None, "tensor"), ("mlp", "up_proj"): P(None, "tensor"),
            ("mlp", "down_proj"): P(None, "fsdp")}
    for (module, proj), spec in want.items():
        bias = getattr(getattr(model.layers, module), proj).bias
        names, units = bias.get_metadata("out_sharding"), bias.get_metadata("axis_units")
        assert logical_spec(names, bias.shape, mesh, units=units) == spec, (module, proj)
    plain = nnx.eval_shape(lambda: Transformer(TransformerConfig.tiny(40), rngs=nnx.Rngs(0)))
    count = lambda m: sum(x.size for x in jax.tree.leaves(nnx.state(m, nnx.Param)))  # noqa: E731
    # per layer: q 64 + k 32 + v 32 + o 64 + gate 128 + up 128 + down 64 = 512, over 2 layers
    assert count(model) - count(plain) == 2 * 512


def test_a_multimodal_gemma3_folder_reads_attention_bias_from_its_text_config(hf_copy):
    """gemma3 folders hold the flag in text_config (as Gemma3TextConfig has it); then the folder's
    weights must hold the biases, and a folder without them names the first missing key."""
    folder = hf_copy("gemma3")
    config = json.loads((folder / "config.json").read_text())
    config["text_config"]["attention_bias"] = True
    (folder / "config.json").write_text(json.dumps(config))
    loaded = load_hf_config(folder)
    assert (loaded.attention_bias, loaded.attention_out_bias, loaded.mlp_bias) == (True, True, False)
    with pytest.raises(ValueError, match=r"missing key\(s\) \[.*layers\.0\.self_attn\.k_proj\.bias"):
        load_hf_model(folder)
