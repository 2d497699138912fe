"""safetensors weights of a Hugging Face checkpoint <-> the NNX Transformer's params.

Reads `model.safetensors`, or the shards named by `model.safetensors.index.json`,
with the safetensors numpy backend, one tensor at a time. Every problem names
the file and the key: a missing file or shard, a missing key, an unknown key,
a shape mismatch, an unsupported tensor dtype.
"""

from __future__ import annotations

import contextlib
import re
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jax.numpy as jnp
import numpy as np
from flax import nnx
from safetensors import SafetensorError, safe_open
from safetensors.numpy import save_file

from rl_models.config import TransformerConfig
from rl_models.hf.config import HFFolderError, read_json
from rl_models.transformer import Transformer, param_dtype

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
FLOAT_DTYPES = {"F64", "F32", "F16", "BF16"}
# Buffers some older checkpoints carry; recomputed here from config.json.
_IGNORED = re.compile(r"model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq")

Path_ = tuple[str | int, ...]


@contextlib.contextmanager
def _open(path: Path) -> Iterator[Any]:
    """`safe_open` whose errors (an empty or truncated file, a bad header) name the file."""
    try:
        with safe_open(path, framework="np") as f:
            yield f
    except SafetensorError as e:
        size = path.stat().st_size if path.exists() else 0
        raise HFFolderError(f"{path}: not a readable safetensors file ({size} bytes; {e}); is it truncated?") from e


def parameter_map(config: TransformerConfig) -> dict[str, tuple[Path_, bool]]:
    """Hugging Face key -> (NNX param path, transposed). HF Linear weights are
    [out, in]; kernels here are [in, out]."""
    names: dict[str, tuple[Path_, bool]] = {"model.embed_tokens.weight": (("embed",), False)}
    for i in range(config.num_layers):
        hf, ours = f"model.layers.{i}", ("layers", i)
        names[f"{hf}.input_layernorm.weight"] = ((*ours, "attn_norm", "weight"), False)
        names[f"{hf}.post_attention_layernorm.weight"] = ((*ours, "mlp_norm", "weight"), False)
        for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
            names[f"{hf}.self_attn.{proj}.weight"] = ((*ours, "attn", proj, "kernel"), True)
        if config.attention_bias:
            for proj in ("q_proj", "k_proj", "v_proj"):
                names[f"{hf}.self_attn.{proj}.bias"] = ((*ours, "attn", proj, "bias"), False)
        if config.qk_norm:
            for norm in ("q_norm", "k_norm"):
                names[f"{hf}.self_attn.{norm}.weight"] = ((*ours, "attn", norm, "weight"), False)
        for proj in ("gate_proj", "up_proj", "down_proj"):
            names[f"{hf}.mlp.{proj}.weight"] = ((*ours, "mlp", proj, "kernel"), True)
    names["model.norm.weight"] = (("final_norm", "weight"), False)
    if not config.tie_embeddings:
        names["lm_head.weight"] = (("lm_head", "kernel"), True)
    return names


def weight_files(folder: Path) -> dict[str, Path]:
    """Every tensor key in the folder's checkpoint -> the file that holds it."""
    index = folder / INDEX_FILE
    if index.is_file():
        weight_map = read_json(index).get("weight_map")
        if not isinstance(weight_map, dict):
            raise HFFolderError(f"{index}: no 'weight_map' object")
        shards = {name: folder / name for name in set(weight_map.values())}
        for name, path in sorted(shards.items()):
            if not path.is_file():
                raise FileNotFoundError(f"{index} names shard {name!r}, which is missing from {folder}")
        listed = {key: shards[name] for key, name in weight_map.items()}
        for path in set(listed.values()):
            with _open(path) as f:
                present = set(f.keys())
            for key, where in listed.items():
                if where == path and key not in present:
                    raise HFFolderError(f"{index} places key {key!r} in {path}, which lacks it")
        return listed
    single = folder / SINGLE_FILE
    if single.is_file():
        with _open(single) as f:
            return {key: single for key in f.keys()}
    found = sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []
    raise FileNotFoundError(
        f"{folder}: no {SINGLE_FILE} or {INDEX_FILE} (found {found}); "
        "only safetensors checkpoints are read"
    )


def load_params(folder: Path, config: TransformerConfig) -> Transformer:
    """A Transformer with `config` whose params are read from `folder`, cast to
    `config.param_dtype`."""
    files = weight_files(folder)
    expected = parameter_map(config)
    unknown = sorted(
        k for k in files
        if k not in expected and not _IGNORED.fullmatch(k)
        and not (config.tie_embeddings and k == "lm_head.weight")
    )
    if unknown:
        shown = ", ".join(f"{k!r} in {files[k]}" for k in unknown[:10])
        more = f" and {len(unknown) - 10} more" if len(unknown) > 10 else ""
        raise HFFolderError(
            f"unknown key(s) for a model with {folder / 'config.json'}: {shown}{more}"
        )
    missing = sorted(k for k in expected if k not in files)
    if missing:
        where = INDEX_FILE if (folder / INDEX_FILE).is_file() else SINGLE_FILE
        raise HFFolderError(
            f"{folder / where}: missing key(s) {missing[:10]}"
            + (f" and {len(missing) - 10} more" if len(missing) > 10 else "")
        )

    abstract = nnx.eval_shape(lambda: Transformer(config, rngs=nnx.Rngs(0)))
    graphdef, state = nnx.split(abstract)
    slots = dict(nnx.to_flat_state(state))
    dtype = param_dtype(config)
    values: dict[Path_, jnp.ndarray] = {}
    by_file: dict[Path, list[str]] = defaultdict(list)
    for key in expected:
        by_file[files[key]].append(key)
    for path, keys in by_file.items():
        with _open(path) as f:
            for key in keys:
                ours, transposed = expected[key]
                want = tuple(slots[ours].shape)
                want_hf = want[::-1] if transposed else want
                view = f.get_slice(key)
                got, kind = tuple(view.get_shape()), view.get_dtype()
                if got != want_hf:
                    raise HFFolderError(
                        f"{path}: key {key!r} has shape {list(got)}, but config.json "
                        f"needs {list(want_hf)}"
                    )
                if kind not in FLOAT_DTYPES:
                    raise HFFolderError(
                        f"{path}: key {key!r} has dtype {kind}; only {sorted(FLOAT_DTYPES)} "
                        "are read (quantized checkpoints are not supported)"
                    )
                array = np.asarray(f.get_tensor(key))
                values[ours] = jnp.asarray(array.T if transposed else array, dtype=dtype)
    flat = [(p, var.replace(values[p])) for p, var in slots.items()]
    return nnx.merge(graphdef, nnx.from_flat_state(flat))


def save_params(model: Transformer, path: Path) -> None:
    """Write `model`'s params to one safetensors file under Hugging Face names,
    in the dtype they are stored in."""
    slots = dict(nnx.to_flat_state(nnx.state(model, nnx.Param)))
    tensors = {}
    for key, (ours, transposed) in parameter_map(model.config).items():
        array = np.asarray(slots[ours][...])
        tensors[key] = np.ascontiguousarray(array.T if transposed else array)
    save_file(tensors, str(path), metadata={"format": "pt"})
