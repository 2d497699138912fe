"""safetensors weights of a Hugging Face checkpoint <-> the NNX Transformer's params.

Reads `model.safetensors`, or the shards named by `model.safetensors.index.json`,
with the safetensors numpy backend, one tensor at a time. Every problem names
the file and the key: a missing file or shard, a missing key, an unknown key,
a shape mismatch, an unsupported tensor dtype.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import jax
import numpy as np
from flax import nnx
from safetensors import SafetensorError, safe_open
from safetensors.numpy import save_file

from rl_models.config import TransformerConfig
from rl_models.hf.config import HFFolderError, read_json
from rl_models.hf.family import Family
from rl_models.hf.mxfp4 import dequantize_mxfp4
from rl_models.hf.weight_maps import Path_, row_range, split_key
from rl_models.hybrid import model_class
from rl_models.transformer import Transformer, param_dtype

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
FLOAT_DTYPES = {"F64", "F32", "F16", "BF16"}
# Buffers some older checkpoints carry; recomputed here from config.json.
_IGNORED = re.compile(r"model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq")

TEXT_LAYOUTS = (("model.", "lm_head.weight"),
                ("model.language_model.", "lm_head.weight"),
                ("language_model.model.", "language_model.lm_head.weight"))
"""(prefix of the text model's keys, key of its unembedding): a causal LM's, then a multimodal
model's as transformers 5 saves it and as older folders (Gemma 3 on the Hub) hold it."""


class _Tensors:
    """The folder's tensors by key; an MXFP4 pair `<key>_blocks` / `<key>_scales` (gpt-oss's
    published experts) reads as `<key>`, dequantised, in transformers' layout [E, in, out]."""

    def __init__(self, files: dict[str, Path], handles: dict[Path, Any]):
        self.files, self.handles = files, handles
        self.packed = {k[: -len("_blocks")]: (k, k[: -len("_blocks")] + "_scales") for k in files
                       if k.endswith("_blocks") and k[: -len("_blocks")] + "_scales" in files}
        pairs = {k for pair in self.packed.values() for k in pair}
        self.names = {k for k in files if k not in pairs} | set(self.packed)

    def file(self, key: str) -> Path:
        return self.files[self.packed[key][0] if key in self.packed else key]

    def shape_dtype(self, key: str) -> tuple[tuple[int, ...], str]:
        if key in self.packed:
            blocks = self.handles[self.file(key)].get_slice(self.packed[key][0]).get_shape()
            e, rows, groups, _ = blocks
            return (e, groups * 32, rows), "F32"
        view = self.handles[self.file(key)].get_slice(key)
        return tuple(view.get_shape()), view.get_dtype()

    def read(self, key: str, index: tuple[slice, ...]) -> np.ndarray:
        if key in self.packed:
            blocks, scales = (np.asarray(self.handles[self.file(key)].get_slice(k)[:]) for k in self.packed[key])
            return dequantize_mxfp4(blocks, scales).transpose(0, 2, 1)[index]
        return np.asarray(self.handles[self.file(key)].get_slice(key)[index])


@contextlib.contextmanager
def _open(path: Path) -> Iterator[Any]:
    """`safe_open` whose errors (an empty or truncated file, a bad header) name the file."""
    try:
        with safe_open(path, framework="np") as f:
            yield f
    except SafetensorError as e:
        size = path.stat().st_size if path.exists() else 0
        raise HFFolderError(f"{path}: not a readable safetensors file ({size} bytes; {e}); is it truncated?") from e


def text_layout(keys: set[str] | dict[str, Path]) -> tuple[str, str]:
    """(prefix, unembedding key) of the folder's text model (TEXT_LAYOUTS; the first by default)."""
    for prefix, head in TEXT_LAYOUTS:
        if f"{prefix}embed_tokens.weight" in keys:
            return prefix, head
    return TEXT_LAYOUTS[0]


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


def load_params(folder: Path, config: TransformerConfig, family: Family,
                shardings: Callable[[nnx.State], Any] | None = None) -> Transformer:
    """A Transformer (a HybridTransformer for Qwen3.5) with `config` whose params are read from `folder`, cast to
    `config.param_dtype`, where `family`'s weight map places them.

    `shardings` maps the abstract param state to a same-shaped tree of
    `jax.sharding.Sharding`s (default: everything on the default device). Each
    device's shard is read from the safetensors files on its own (only the rows
    and columns it holds), so the host never holds a whole stacked parameter and
    no device ever holds the whole model unless its sharding says so.
    """
    files = weight_files(folder)
    prefix, head = text_layout(files)
    expected = family.weights(config, prefix, head)
    ignored = re.compile(family.ignored_keys) if family.ignored_keys else None
    with ExitStack() as stack:
        names = _Tensors(files, {path: stack.enter_context(_open(path)) for path in set(files.values())}).names
    read_keys = {split_key(k)[0] for k in expected}
    unknown = sorted(
        k for k in names
        if k not in read_keys and not _IGNORED.fullmatch(k)
        and not (config.tie_embeddings and k == head)
        and not (ignored and ignored.fullmatch(k))
    )
    if unknown:
        shown = ", ".join(f"{k!r} in {files.get(k, files.get(k + '_blocks'))}" for k in unknown[:10])
        more = f" and {len(unknown) - 10} more" if len(unknown) > 10 else ""
        raise HFFolderError(
            f"unknown key(s) for a model with {folder / 'config.json'}: {shown}{more}"
        )
    missing = sorted({split_key(k)[0] for k in expected} - names)
    if missing:
        where = INDEX_FILE if (folder / INDEX_FILE).is_file() else SINGLE_FILE
        raise HFFolderError(
            f"{folder / where}: missing key(s) {missing[:10]}"
            + (f" and {len(missing) - 10} more" if len(missing) > 10 else "")
        )

    abstract = nnx.eval_shape(lambda: model_class(config)(config, rngs=nnx.Rngs(0)))
    graphdef, state = nnx.split(abstract)
    slots = dict(nnx.to_flat_state(state))
    if shardings is None:
        device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
        placement = {p: device for p in slots}
    else:
        placement = {
            p: v.get_value() if isinstance(v, nnx.Variable) else v for p, v in nnx.to_flat_state(shardings(state))
        }
    dtype = param_dtype(config)
    # every HF key feeding each param, by its leading indices: none for unstacked params, the layer
    # for stacked ones, the layer and the expert for expert weights
    sources: dict[Path_, dict[tuple[int, ...], str]] = defaultdict(dict)
    for key, slot in expected.items():
        sources[slot.path][slot.index()] = key

    with ExitStack() as stack:
        tensors = _Tensors(files, {path: stack.enter_context(_open(path)) for path in set(files.values())})
        for key, slot in expected.items():  # check every tensor before reading any
            want = tuple(slots[slot.path].shape)[len(slot.index()):]
            want_hf = want[::-1] if slot.transposed else want
            base, _, step = split_key(key)
            want_hf = (*want_hf[:-1], want_hf[-1] * step)
            got, kind = tensors.shape_dtype(base)
            rows = row_range(key)
            if rows is not None and want_hf[0] == rows[1] - rows[0] and got[0] >= rows[1]:
                want_hf = (got[0], *want_hf[1:])  # rows of a fused tensor: the rest of its shape must match
            if got != want_hf:
                raise HFFolderError(
                    f"{tensors.file(base)}: key {base!r} has shape {list(got)}, but config.json "
                    f"needs {list(want_hf)}"
                )
            if kind not in FLOAT_DTYPES:
                raise HFFolderError(
                    f"{tensors.file(base)}: key {base!r} has dtype {kind}; only {sorted(FLOAT_DTYPES)} "
                    "and MXFP4 block/scale pairs are read"
                )

        def read(key: str, transposed: bool, index: tuple[slice, ...]) -> np.ndarray:
            """One tensor's block `index` (in our [in, out] orientation)."""
            base, start, step = split_key(key)
            hf_index = index[::-1] if transposed else index
            rows = row_range(key)
            if rows is not None:  # rows of a fused tensor: the block's, shifted to where they start
                first, stop, _ = hf_index[0].indices(rows[1] - rows[0])
                hf_index = (slice(rows[0] + first, rows[0] + stop), *hf_index[1:])
            if step > 1:  # the block's columns, every step-th from start (read whole, then strided)
                first, stop, _ = hf_index[-1].indices(10**12)
                cols = slice(start + step * first, start + step * (stop - 1) + 1)
                block = tensors.read(base, (*hf_index[:-1], cols))[..., ::step]
            else:
                block = tensors.read(base, hf_index)
            block = block.T if transposed else block
            offset = expected[key].offset
            return (block.astype(np.float32) + np.float32(offset)).astype(dtype) if offset else block.astype(dtype)

        def load(path: Path_) -> jax.Array:
            shape = tuple(slots[path].shape)
            keys = sources[path]

            lead = len(next(iter(keys)))

            def shard(index: tuple[slice, ...]) -> np.ndarray:
                index = tuple(slice(*s.indices(n)) for s, n in zip(index, shape, strict=True))

                def block(at: tuple[int, ...]) -> np.ndarray:  # the tensors under leading indices `at`
                    if len(at) == lead:
                        return read(keys[at], expected[keys[at]].transposed, index[lead:])
                    j = len(at)
                    return np.stack([block((*at, i)) for i in range(*index[j].indices(shape[j]))])

                return block(())

            return jax.make_array_from_callback(shape, placement[path], shard)

        flat = [(p, var.replace(load(p))) for p, var in slots.items()]
    return nnx.merge(graphdef, nnx.from_flat_state(flat))


def save_params(model: Transformer, path: Path, family: Family) -> None:
    """Write `model`'s params to one safetensors file under `family`'s Hugging Face names,
    in the dtype they are stored in."""
    slots = dict(nnx.to_flat_state(nnx.state(model, nnx.Param)))
    arrays = {p: np.asarray(v[...]) for p, v in slots.items()}
    tensors = {}
    row_blocks: dict[str, list[tuple[int, np.ndarray]]] = defaultdict(list)
    for key, slot in family.weights(model.config).items():
        array = arrays[slot.path][slot.index()]
        array = array.T if slot.transposed else array
        if slot.offset:
            array = (array.astype(np.float32) - np.float32(slot.offset)).astype(array.dtype)
        base, start, step = split_key(key)
        rows = row_range(key)
        if rows is not None:  # rows of a fused tensor, joined below in order
            row_blocks[base].append((rows[0], array))
            continue
        if step > 1:  # every step-th column of one tensor (gpt-oss's interleaved gate and up)
            whole = tensors.setdefault(base, np.empty((*array.shape[:-1], array.shape[-1] * step), array.dtype))
            whole[..., start::step] = array
            continue
        tensors[key] = np.ascontiguousarray(array)
    for base, blocks in row_blocks.items():
        tensors[base] = np.ascontiguousarray(np.concatenate([a for _, a in sorted(blocks, key=lambda b: b[0])]))
    save_safetensors(tensors, path)


def save_safetensors(tensors: dict[str, np.ndarray], path: Path) -> None:
    """`safetensors.numpy.save_file`, with the file mode every other file gets (the library
    writes 0600; this is 0666 less the umask, like `open`)."""
    save_file(tensors, str(path), metadata={"format": "pt"})
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, 0o666 & ~umask)
