"""rl_models.hf.from_gguf without a real model: the q/k row order and the errors."""

import sys

import numpy as np
import pytest

from rl_models.hf import HFFolderError
from rl_models.hf.from_gguf import convert_gguf, unpermute_rope_rows
from trainer.cli import main


def llama_cpp_permute(weights, n_head, n_head_kv=None):
    """convert_hf_to_gguf.py's LlamaModel.permute (half-split rotary rows -> adjacent pairs)."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:]).swapaxes(1, 2).reshape(
        weights.shape)


@pytest.mark.parametrize("heads", [1, 3, 9])
def test_unpermute_undoes_llama_cpp_permute(heads):
    w = np.random.default_rng(0).normal(size=(heads * 8, 5)).astype(np.float32)
    np.testing.assert_array_equal(unpermute_rope_rows(llama_cpp_permute(w, heads), heads), w)
    # head 0's rows 0..3 (the first halves of its rotary pairs) land on the even rows
    np.testing.assert_array_equal(llama_cpp_permute(w, heads)[0:8:2], w[0:4])


def test_missing_gguf_package_says_how_to_install_it(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "gguf", None)  # `import gguf` raises ImportError
    with pytest.raises(HFFolderError, match=r"needs the `gguf` package: `uv sync --group real-model`"):
        convert_gguf(tmp_path / "model.gguf", tmp_path / "out")


def test_convert_cli_reports_a_missing_file(tmp_path, capsys):
    pytest.importorskip("gguf", reason="the real-model group is not installed: uv sync --group real-model")
    assert main(["convert", "--gguf", str(tmp_path / "none.gguf"), "--out", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err == f"trainer convert: error: {tmp_path / 'none.gguf'}: no such file\n"


def test_convert_cli_reports_a_file_that_is_not_gguf(tmp_path, capsys):
    pytest.importorskip("gguf", reason="the real-model group is not installed: uv sync --group real-model")
    (tmp_path / "bad.gguf").write_bytes(b"not a gguf file at all" * 4)
    assert main(["convert", "--gguf", str(tmp_path / "bad.gguf"), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"trainer convert: error: {tmp_path / 'bad.gguf'}: not a readable GGUF file"), err


def byte_level_alphabet():
    """GPT-2's bytes_to_unicode: the 256 one-character tokens of a byte-level BPE vocabulary."""
    visible = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    extra = iter(range(256, 512))
    return [chr(b) if b in visible else chr(next(extra)) for b in range(256)]


def write_llama_gguf(path, tensors, config, tokens, types, merges):
    """A float32 llama GGUF as llama.cpp's converter writes one: its names, q/k rows permuted."""
    gguf = pytest.importorskip("gguf", reason="the real-model group is not installed: uv sync --group real-model")
    w = gguf.GGUFWriter(path, "llama")
    w.add_block_count(config.num_layers)
    w.add_context_length(256)
    w.add_embedding_length(config.hidden_size)
    w.add_feed_forward_length(config.mlp_hidden_size)
    w.add_head_count(config.num_heads)
    w.add_head_count_kv(config.num_kv_heads)
    w.add_rope_freq_base(config.rope_theta)
    w.add_layer_norm_rms_eps(config.rms_norm_eps)
    w.add_rope_dimension_count(config.head_dim)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges([" ".join(m) for m in merges])
    w.add_eos_token_id(len(tokens) - 1)
    w.add_chat_template("{% for m in messages %}{{ m['content'] }}<|im_end|>{% endfor %}")
    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}
    layer = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm", "self_attn.q_proj": "attn_q",
             "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
             "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
    for key, value in tensors.items():
        if key in names:
            name = names[key]
        else:
            _, _, i, *rest = key.split(".")
            name = f"blk.{i}.{layer['.'.join(rest[:-1])]}.weight"
        if name.endswith("attn_q.weight"):
            value = llama_cpp_permute(value, config.num_heads)
        elif name.endswith("attn_k.weight"):
            value = llama_cpp_permute(value, config.num_heads, config.num_kv_heads)
        w.add_tensor(name, np.ascontiguousarray(value))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_a_llama_gguf_converts_back_to_its_hugging_face_folder(tmp_path):
    """A tiny model's HF folder, written as llama.cpp would (permuted q/k rows), converts back to
    the same tensors, config and a tokenizer with the file's vocabulary, merges and template."""
    pytest.importorskip("gguf", reason="the real-model group is not installed: uv sync --group real-model")
    from flax import nnx
    from safetensors.numpy import load_file

    from rl_models import Transformer, TransformerConfig
    from rl_models.hf import export_hf, load_hf_config, load_hf_tokenizer

    merges = [("Ġ", "t"), ("h", "e"), ("Ġt", "he")]
    tokens = [*byte_level_alphabet(), *("".join(m) for m in merges), "<|im_end|>"]
    types = [1] * (len(tokens) - 1) + [3]
    config = TransformerConfig.tiny(len(tokens), rms_norm_eps=1e-5)
    export_hf(Transformer(config, rngs=nnx.Rngs(0)), tmp_path / "hf")
    tensors = load_file(str(tmp_path / "hf" / "model.safetensors"))
    write_llama_gguf(tmp_path / "tiny.gguf", tensors, config, tokens, types, merges)

    out = convert_gguf(tmp_path / "tiny.gguf", tmp_path / "out")
    assert load_hf_config(out) == config
    converted = load_file(str(out / "model.safetensors"))
    assert converted.keys() == tensors.keys()
    for key, value in tensors.items():
        np.testing.assert_array_equal(converted[key], value, err_msg=key)
    tok = load_hf_tokenizer(out)
    assert tok.eos_ids == (len(tokens) - 1,)
    assert tok.encode(" the") == [tokens.index("Ġthe")]
    text = tok.apply_chat_template([{"role": "user", "content": "hi the 7"}])
    assert text == "hi the 7<|im_end|>"
    assert tok.decode(tok.encode(text), skip_special=False) == text
    with pytest.raises(FileExistsError, match="not empty"):
        convert_gguf(tmp_path / "tiny.gguf", tmp_path / "out")
