"""LoRA adapters and the quantized base on the Transformer (rl_models.lora, rl_models.quant).

Model-level facts; the learner's (only adapters train, the base stays bit-identical,
the reference is the base) are in tests/algos/test_algo_lora_learner.py.
"""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from safetensors.numpy import load_file

from rl_models import Transformer, TransformerConfig
from rl_models.hf import export_hf, export_peft, load_hf_model
from rl_models import quant
from rl_models.lora import (DEFAULT_TARGETS, adapter_count, add_adapters, linears, merge_adapters, merged_kernel,
                            quantize_base, targeted)
from tolerances import close

V = 32
TOKENS = jnp.array([[1, 5, 9, 3, 7, 2], [4, 4, 8, 1, 0, 6]], jnp.int32)


def tiny(**overrides) -> Transformer:
    return Transformer(TransformerConfig.tiny(V, **overrides), rngs=nnx.Rngs(0))


def logits(model: Transformer, tokens: jax.Array = TOKENS) -> np.ndarray:
    b, n = tokens.shape
    positions = jnp.broadcast_to(jnp.arange(n), (b, n))
    causal = jnp.broadcast_to(jnp.tril(jnp.ones((n, n), bool)), (b, n, n))
    hidden, _ = model(tokens, positions, causal)
    return np.asarray(model.logits(hidden))


def nudged(model: Transformer, amount: float = 0.05) -> Transformer:
    """`model` with every adapter entry moved by a fixed pattern (B != 0: the adapters act)."""
    graphdef, adapters, rest = nnx.split(model, nnx.LoRAParam, ...)
    moved = jax.tree.map(lambda x: x + amount * jnp.cos(jnp.arange(x.size, dtype=x.dtype)).reshape(x.shape),
                         nnx.to_pure_dict(adapters))
    return nnx.merge(graphdef, moved, rest)


def test_trainable_count_is_the_analytic_count():
    # tiny: D=64, 4 heads of 16 (q/o 64 -> 64), 2 KV heads (k/v 64 -> 32), MLP 128, 2 layers.
    # rank r adds r * (in + out) per projection and layer:
    #   q 8*(64+64)=1024, k 8*(64+32)=768, v 768, o 1024, gate/up/down 8*(64+128)=1536 each
    #   = 8192 per layer, 16,384 for two layers.
    model = add_adapters(tiny(), rank=8, alpha=16.0)
    assert adapter_count(model) == 16_384
    # only q and v (the LoRA paper's choice): (1024 + 768) * 2 layers
    assert adapter_count(add_adapters(tiny(), rank=8, alpha=16.0, targets=["q_proj", "v_proj"])) == 3_584
    shapes = jax.tree.map(jnp.shape, nnx.to_pure_dict(nnx.state(model, nnx.LoRAParam)))
    assert shapes["layers"]["attn"]["k_proj"] == {"lora_a": (2, 64, 8), "lora_b": (2, 8, 32)}  # stacked like the kernels


def test_targets_match_whole_path_components_and_typos_fail():
    model = tiny()
    assert list(targeted(model, ["mlp/.*"])) == ["layers/mlp/down_proj", "layers/mlp/gate_proj", "layers/mlp/up_proj"]
    assert len(targeted(model, DEFAULT_TARGETS)) == 7
    with pytest.raises(ValueError, match="'q_prj' matches no projection.*layers/attn/q_proj"):
        add_adapters(model, rank=4, alpha=8.0, targets=["q_prj"])
    with pytest.raises(ValueError, match="matches no projection"):
        targeted(model, ["proj"])  # a part of a name is not a component


def test_fresh_adapters_change_nothing_bit_for_bit():
    base = logits(tiny())
    adapted = add_adapters(tiny(), rank=8, alpha=16.0)
    np.testing.assert_array_equal(logits(adapted), base)  # B = 0: the term is exactly 0
    assert not np.array_equal(logits(nudged(adapted)), base)  # and it is on the path


def test_decoding_with_the_cache_applies_adapters_like_the_full_forward():
    """The one-token decoding path fuses q/k/v and gate/up into one matmul; adapters must
    still add their terms there (else the sampler would run without them)."""
    model = nudged(add_adapters(tiny(), rank=4, alpha=8.0))
    full = logits(model)
    b, n = TOKENS.shape
    cache = model.init_cache(b, n)
    steps = []
    for t in range(n):
        mask = jnp.broadcast_to(jnp.arange(n)[None, None, :] <= t, (b, 1, n))
        hidden, cache = model(TOKENS[:, t : t + 1], jnp.full((b, 1), t), mask, cache, t)
        steps.append(np.asarray(model.logits(hidden))[:, 0])
    np.testing.assert_allclose(np.stack(steps, axis=1), full, **close(atol=1e-5))


def test_merged_model_exports_and_reloads_with_the_adapted_logits(tmp_path):
    model = nudged(add_adapters(tiny(attention_bias=True), rank=8, alpha=16.0))
    merged = merge_adapters(model)
    assert not jax.tree.leaves(nnx.state(merged, nnx.LoRAParam))
    reloaded = load_hf_model(export_hf(merged, tmp_path / "hf"))
    np.testing.assert_allclose(logits(reloaded), logits(model), **close(atol=1e-5))


def test_peft_adapter_has_peft_names_shapes_and_scale(tmp_path):
    model = nudged(add_adapters(tiny(), rank=4, alpha=8.0, targets=["q_proj", "k_proj", "down_proj"]))
    out = export_peft(model, tmp_path / "adapter", base_model_name_or_path="/data/base")
    config = json.loads((out / "adapter_config.json").read_text())
    assert config["peft_type"] == "LORA" and config["task_type"] == "CAUSAL_LM"
    assert (config["r"], config["lora_alpha"], config["base_model_name_or_path"]) == (4, 8.0, "/data/base")
    assert config["target_modules"] == ["down_proj", "k_proj", "q_proj"]
    tensors = load_file(str(out / "adapter_model.safetensors"))
    assert len(tensors) == 2 * 3 * 2  # A and B, three projections, two layers
    # PEFT stores lora_A [r, in] and lora_B [out, r]
    assert tensors["base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"].shape == (4, 64)
    assert tensors["base_model.model.model.layers.1.self_attn.k_proj.lora_B.weight"].shape == (32, 4)
    assert tensors["base_model.model.model.layers.1.mlp.down_proj.lora_A.weight"].shape == (4, 128)
    assert tensors["base_model.model.model.layers.1.mlp.down_proj.lora_B.weight"].shape == (64, 4)
    # PEFT's delta W^T = (alpha / r) B_peft A_peft equals the adapter's (alpha / r) (A B)^T, layer 1
    lin = model.layers.mlp.down_proj
    stem = "base_model.model.model.layers.1.mlp.down_proj"
    peft_delta = 2.0 * tensors[f"{stem}.lora_B.weight"] @ tensors[f"{stem}.lora_A.weight"]
    ours = 2.0 * np.asarray(lin.lora_a[...][1]) @ np.asarray(lin.lora_b[...][1])
    np.testing.assert_allclose(peft_delta, ours.T, **close(rtol=1e-6, atol=1e-7))


# Max |logit difference| from full precision on TOKENS (logits up to about 2.5 in size):
# measured 0.046 (int8), 0.78 (int4), 0.65 (NF4) for these random weights, whose values
# are far from the bell shape NF4 is made for. The bounds leave room for other draws.
QLORA_TOLERANCE = {"int8": 0.1, "int4": 1.5, "nf4": 1.5}


@pytest.mark.parametrize("qtype", sorted(QLORA_TOLERANCE))
def test_quantized_base_stays_within_tolerance(qtype):
    base = logits(tiny())
    model = quantize_base(tiny(), qtype)
    kernel = model.layers.mlp.up_proj.kernel
    assert kernel[...].dtype == {"int8": jnp.int8, "int4": jnp.int4, "nf4": jnp.uint4}[qtype]
    diff = np.abs(logits(model) - base).max()
    assert 0 < diff <= QLORA_TOLERANCE[qtype]
    assert np.abs(base).max() > 1.0  # the logits are not so small that any error would pass


# NF4's 16 levels (QLoRA, arXiv:2305.14314, Appendix E): quantiles of N(0, 1) scaled to [-1, 1].
NF4 = np.array([-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635,
                -0.18477343022823334, -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725,
                0.24611230194568634, 0.33791524171829224, 0.44070982933044434, 0.5626170039176941,
                0.7229568362236023, 1.0], np.float32)  # fmt: skip


def reference_quantize(kernel: np.ndarray, qtype: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """NumPy reference of rl_models.quant for a kernel [L, in, out]: (codes, ties, scale per entry).

    Absmax scales per layer, output channel and block of input rows: the whole input axis for
    int8, 64 rows for int4 and NF4 (bitsandbytes' blocks). int8/int4: scale = absmax / (qmax + 1/2)
    (the top code's rounding bucket reaches absmax), code = round(w / scale) in [-qmax - 1, qmax],
    value = code * scale; NF4: scale = absmax, code = the index of the NF4 level nearest to
    w / scale, value = NF4[code] * scale. `ties`: entries with w / scale = +-(qmax + 1/2) up to
    float rounding (a block's absmax entry), where either neighbouring code is right.
    """
    lead, n_in, n_out = kernel.shape
    rows = n_in if qtype == "int8" else 64
    blocks = kernel.reshape(lead, n_in // rows, rows, n_out)
    absmax = np.abs(blocks).max(axis=2, keepdims=True)
    if qtype == "nf4":
        scale = absmax
        codes = np.abs((blocks / scale)[..., None] - NF4).argmin(axis=-1)
        ties = np.zeros(blocks.shape, bool)
    else:
        qmax = {"int8": 127, "int4": 7}[qtype]
        scale = absmax / np.float32(qmax + 0.5)
        codes = np.clip(np.round(blocks / scale), -qmax - 1, qmax)
        ties = np.isclose(np.abs(blocks / scale), qmax + 0.5, rtol=1e-5, atol=0)
    scale = np.broadcast_to(scale, blocks.shape).reshape(kernel.shape)
    return codes.reshape(kernel.shape).astype(np.int32), ties.reshape(kernel.shape), scale


def assert_quantized_as_the_reference(codes, values, kernel: np.ndarray, qtype: str, msg: str = "") -> None:
    """`codes` are the reference's (either neighbour at a tie) and `values` (the dequantized
    kernel) are each code's level times the reference's scale of its block."""
    got = np.asarray(codes).astype(np.int32)
    want, ties, scale = reference_quantize(kernel, qtype)
    np.testing.assert_array_equal(np.where(ties, want, got), want, err_msg=msg)
    assert np.all(np.abs(got - want)[ties] <= 1), msg
    levels = NF4[got] if qtype == "nf4" else got.astype(np.float32)
    np.testing.assert_allclose(np.asarray(values), levels * scale, **close(rtol=1e-6), err_msg=msg)


@pytest.mark.parametrize("qtype", ["int4", "int8", "nf4"])
def test_codes_and_scales_match_a_numpy_absmax_reference_per_block(qtype):
    """Four blocks of 64 input rows, each 4x larger than the one before, and output channels of
    growing size: with one scale per tensor (or per channel, without blocks) the small blocks
    would quantize to nearly all zeros, and the codes would differ from the reference's."""
    rng = np.random.default_rng(0)
    block_size = np.repeat(4.0 ** np.arange(4), 64)[None, :, None]
    channel_size = np.linspace(0.5, 2.0, 24)[None, None, :]
    kernel = (rng.standard_normal((2, 256, 24)) * block_size * channel_size).astype(np.float32)
    codes, scale = quant.quantize(jnp.asarray(kernel), qtype)
    assert scale.shape == {"int8": (2, 1, 24), "int4": (2, 4, 24), "nf4": (2, 4, 24)}[qtype]
    assert_quantized_as_the_reference(codes, quant.dequantize(codes, scale, qtype), kernel, qtype)


@pytest.mark.parametrize("qtype", ["int4", "nf4"])
def test_quantize_base_stores_each_projection_as_the_reference_codes(qtype):
    """Through the model: D=128 and MLP 256, so every block projection has 2 (q/k/v/o, gate/up)
    or 4 (down) blocks of 64 input rows; the merge (and the export) dequantizes the same values."""
    plain = tiny(hidden_size=128, mlp_hidden_size=256)
    kernels = {path: np.asarray(lin.kernel[...]) for path, lin in linears(plain).items() if path.startswith("layers/")}
    assert len(kernels) == 7 and min(k.shape[-2] for k in kernels.values()) == 128
    quantized = linears(quantize_base(plain, qtype))
    for path, kernel in kernels.items():
        lin = quantized[path]
        assert_quantized_as_the_reference(lin.kernel[...], merged_kernel(lin), kernel, qtype, msg=path)


def test_qlora_adapters_on_a_quantized_base_merge_into_a_plain_model(tmp_path):
    model = nudged(add_adapters(quantize_base(tiny(), "int8"), rank=4, alpha=8.0))
    merged = merge_adapters(model)  # dequantized W + (alpha / r) A B, float32
    assert merged.layers.attn.q_proj.kernel[...].dtype == jnp.float32
    np.testing.assert_allclose(logits(merged), logits(model), **close(atol=1e-5))


def test_lora_finds_gemma3s_seven_projections_and_fresh_adapters_change_nothing(hf_fixtures):
    """Gemma 3's block (GeGLU, sandwich norms, q/k norm) has the same seven projections."""
    model = add_adapters(load_hf_model(hf_fixtures / "gemma3_text"), rank=4, alpha=8.0)
    assert len(targeted(model, DEFAULT_TARGETS)) == 7
    # rank 4 over 6 layers: q, o 64 -> 64; k, v 64 -> 32; gate, up 64 -> 128; down 128 -> 64
    assert adapter_count(model) == 6 * 4 * (2 * (64 + 64) + 2 * (64 + 32) + 3 * (64 + 128)) == 24_576
    graphdef, state = nnx.split(model)
    causal = jnp.broadcast_to(jnp.tril(jnp.ones((6, 6), bool)), (2, 6, 6))

    @jax.jit
    def run(state):
        m = nnx.merge(graphdef, state)
        return m.logits(m(TOKENS, jnp.broadcast_to(jnp.arange(6), (2, 6)), causal)[0])

    base = run(state)
    np.testing.assert_array_equal(run(nnx.state(nudged(model, 0.0))), base)
    assert np.abs(run(nnx.state(nudged(model))) - base).max() > 1e-2


@pytest.mark.e2e
@pytest.mark.parametrize("name", ["gemma3_text", "mistral", "smollm3", "llama_bias", "smollm3_bias", "gemma2"])
def test_lora_and_qlora_target_each_familys_projections(hf_fixtures, tmp_path, name):
    """The families' blocks (biased ones too) have the same seven projections: the default targets
    find them all, fresh adapters change nothing, adapted kernels merge and export to the adapted
    logits (biases kept beside the merged kernels), and a QLoRA model decodes with the cache as its
    full forward computes (windows and biases included)."""
    base = load_hf_model(hf_fixtures / name)
    tokens = jnp.asarray([[5, 17, 42, 99, 130, 255, 8, 13, 21, 3]], jnp.int32)  # longer than the windows
    want = logits(base, tokens)
    model = add_adapters(load_hf_model(hf_fixtures / name), rank=4, alpha=8.0)
    assert len(targeted(model, DEFAULT_TARGETS)) == 7
    np.testing.assert_array_equal(logits(model, tokens), want)
    model = nudged(model)
    adapted = logits(model, tokens)
    assert np.abs(adapted - want).max() > 1e-2
    reloaded = load_hf_model(export_hf(merge_adapters(model), tmp_path / name))
    np.testing.assert_allclose(logits(reloaded, tokens), adapted, atol=1e-4, rtol=1e-4)

    qlora = nudged(add_adapters(quantize_base(load_hf_model(hf_fixtures / name), "int8"), rank=4, alpha=8.0))
    full = logits(qlora, tokens)
    n = tokens.shape[1]
    cache = qlora.init_cache(1, n)
    steps = []
    step = jax.jit(lambda m, token, t, cache: (lambda h, c: (m.logits(h), c))(
        *m(token, jnp.full((1, 1), t), (jnp.arange(n) <= t)[None, None], cache, t)))
    for t in range(n):
        out, cache = step(qlora, tokens[:, t : t + 1], t, cache)
        steps.append(np.asarray(out)[:, 0])
    np.testing.assert_allclose(np.stack(steps, axis=1), full, atol=1e-4, rtol=1e-4)


def test_peft_export_of_phi3s_separate_projection_adapters_is_refused(hf_fixtures, tmp_path):
    """Phi-3 fuses q/k/v (and gate/up) into one module, which PEFT adapts whole: adapters of the
    separate projections have no PEFT name there, so the export says so instead of writing q_proj."""
    model = add_adapters(load_hf_model(hf_fixtures / "phi3"), rank=4, alpha=8.0)
    with pytest.raises(ValueError, match=r"phi3 fuses q/k/v and gate/up into one module each"):
        export_peft(model, tmp_path / "adapter")
