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
from typing import Any, NamedTuple

import jax
import numpy as np
from flax import nnx
from safetensors import SafetensorError, safe_open
from safetensors.numpy import save_file

from rl_models.config import TransformerConfig
from rl_models.hf.config import HFFolderError, read_json
from rl_models.hybrid import model_class
from rl_models.hf.mxfp4 import dequantize_mxfp4
from rl_models.transformer import Transformer, param_dtype

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
FLOAT_DTYPES = {"F64", "F32", "F16", "BF16"}
# Buffers some older checkpoints carry; recomputed here from config.json.
_IGNORED = re.compile(r"model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq")
# Qwen3.5's vision tower and multi-token-prediction head: not part of the text model.
_IGNORED_HYBRID = re.compile(r"(model\.visual|mtp)\..*")
# A multimodal folder's other towers (Gemma 3): its text model is read, they are not.
_OTHER_TOWERS = re.compile(r"(model\.)?(vision_tower|multi_modal_projector)\..*")

TEXT_LAYOUTS = (("model.", "lm_head.weight"),
                ("model.language_model.", "lm_head.weight"),
                ("language_model.model.", "language_model.lm_head.weight"))
"""(prefix of the text model's keys, key of its unembedding): a causal LM's, then a multimodal
model's as transformers 5 saves it and as older folders (Gemma 3 on the Hub) hold it."""

Path_ = tuple[str | int, ...]

_TAKE = re.compile(r"(.+)\[(\d+)::(\d+)\]")
"""A key naming every step-th column of a tensor from start on, `<key>[start::step]` (gpt-oss
interleaves each expert's gate and up columns in one gate_up_proj)."""


_ROWS = re.compile(r"(.+)\[(\d+):(\d+)\]")
"""A key naming rows start..stop of a tensor's first axis, `<key>[start:stop]` (Phi-3's fused
qkv_proj and gate_up_proj hold q, k and v, or gate and up, one after the other)."""

FUSED_FAMILIES = ("phi3",)
"""The model_types whose folders fuse q/k/v and gate/up into one Linear each (`parameter_map(fused=True)`)."""


def split_key(key: str) -> tuple[str, int, int]:
    """(the tensor's key, first column, column step) of a parameter_map key."""
    m = _TAKE.fullmatch(key)
    if m:
        return m.group(1), int(m.group(2)), int(m.group(3))
    rows = _ROWS.fullmatch(key)
    return (rows.group(1), 0, 1) if rows else (key, 0, 1)


def row_range(key: str) -> tuple[int, int] | None:
    """(start, stop) of a `<key>[start:stop]` parameter_map key's rows; None for a whole tensor."""
    m = _ROWS.fullmatch(key)
    return (int(m.group(2)), int(m.group(3))) if m else None


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


class Slot(NamedTuple):
    """Where a Hugging Face tensor lives in the NNX params."""

    path: Path_  # the param's path in the model's state
    layer: int | None  # index on the stacked layer axis, or None for unstacked params
    transposed: bool  # HF Linear weights are [out, in]; kernels here are [in, out]
    offset: float = 0.0  # added on reading, taken off on writing: Qwen3.5's (1 + w) norms hold 1 + w here
    expert: int | None = None  # index on the expert axis (after the layer's) of an expert weight

    def index(self) -> tuple[int, ...]:
        """The leading indices of the param that the tensor fills."""
        return tuple(i for i in (self.layer, self.expert) if i is not None)


def parameter_map(config: TransformerConfig, prefix: str = "model.", head: str = "lm_head.weight",
                  fused: bool = False) -> dict[str, Slot]:
    """Hugging Face key -> its Slot. Layer i's tensors are row i of the stacked
    `layers` params. `prefix` and `head`: the text model's keys (see TEXT_LAYOUTS). `fused`:
    q/k/v in one `qkv_proj` and gate/up in one `gate_up_proj` (Phi-3), each projection its rows."""
    if config.hybrid:
        return hybrid_parameter_map(config, prefix)
    names: dict[str, Slot] = {f"{prefix}embed_tokens.weight": Slot(("embed",), None, False)}
    # the block's norms: Llama's two, Gemma's four (each sub-layer's input and output), or OLMo 2's
    # two after the sub-layers (Llama's name for the MLP's input norm is its attention's output norm)
    norms = {"input_layernorm": "attn_norm", "post_attention_layernorm": "mlp_norm"}
    if config.post_norms:
        norms = {"post_attention_layernorm": "attn_post_norm", "post_feedforward_layernorm": "mlp_post_norm"}
    if config.sandwich_norms:
        norms = {"input_layernorm": "attn_norm", "post_attention_layernorm": "attn_post_norm",
                 "pre_feedforward_layernorm": "mlp_norm", "post_feedforward_layernorm": "mlp_post_norm"}
    for i in range(config.num_layers):
        hf = f"{prefix}layers.{i}"

        def at(*path: str, transposed: bool = False, i: int = i) -> Slot:
            return Slot(("layers", *path), i, transposed)

        for name, ours in norms.items():
            names[f"{hf}.{name}.weight"] = at(ours, "weight")
        for proj, key in _projection_keys(config, fused):
            names[f"{hf}.self_attn.{key}"] = at("attn", proj, "kernel", transposed=True)
        if config.attention_bias:
            for proj in ("q_proj", "k_proj", "v_proj"):
                names[f"{hf}.self_attn.{proj}.bias"] = at("attn", proj, "bias")
        if config.qk_norm:
            for norm in ("q_norm", "k_norm"):
                names[f"{hf}.self_attn.{norm}.weight"] = at("attn", norm, "weight")
        if config.attention_out_bias:
            names[f"{hf}.self_attn.o_proj.bias"] = at("attn", "o_proj", "bias")
        if config.attention_sinks:
            names[f"{hf}.self_attn.sinks"] = at("attn", "sinks")
        if config.num_experts and config.expert_bias:  # as gpt-oss ships them: every expert in one tensor
            names[f"{hf}.mlp.router.weight"] = at("mlp", "router", "kernel", transposed=True)
            names[f"{hf}.mlp.router.bias"] = at("mlp", "router", "bias")
            experts = f"{hf}.mlp.experts"
            for ours, key in (("gate_proj", "gate_up_proj[0::2]"), ("up_proj", "gate_up_proj[1::2]"),
                              ("gate_bias", "gate_up_proj_bias[0::2]"), ("up_bias", "gate_up_proj_bias[1::2]"),
                              ("down_proj", "down_proj"), ("down_bias", "down_proj_bias")):
                names[f"{experts}.{key}"] = at("mlp", ours)
            continue
        if config.num_experts:  # as Qwen3-MoE ships them: a router and one tensor per expert and projection
            names[f"{hf}.mlp.gate.weight"] = at("mlp", "router", "kernel", transposed=True)
            for e in range(config.num_experts):
                for proj in ("gate_proj", "up_proj", "down_proj"):
                    names[f"{hf}.mlp.experts.{e}.{proj}.weight"] = Slot(("layers", "mlp", proj), i, True, expert=e)
            continue
        f = config.mlp_hidden_size
        mlp = {"gate_proj": f"gate_up_proj.weight[0:{f}]", "up_proj": f"gate_up_proj.weight[{f}:{2 * f}]"} if fused \
            else {"gate_proj": "gate_proj.weight", "up_proj": "up_proj.weight"}
        for proj in ("gate_proj", "up_proj", "down_proj"):
            names[f"{hf}.mlp.{mlp.get(proj, proj + '.weight')}"] = at("mlp", proj, "kernel", transposed=True)
            if config.mlp_bias:
                names[f"{hf}.mlp.{proj}.bias"] = at("mlp", proj, "bias")
    names[f"{prefix}norm.weight"] = Slot(("final_norm", "weight"), None, False)
    if not config.tie_embeddings:
        names[head] = Slot(("lm_head", "kernel"), None, True)
    return names


def _projection_keys(config: TransformerConfig, fused: bool) -> list[tuple[str, str]]:
    """(our projection, its key under self_attn) for q, k, v and o: Phi-3's fused qkv_proj holds q's
    H * Dh rows, then k's and v's K * Dh each."""
    if not fused:
        return [(proj, f"{proj}.weight") for proj in ("q_proj", "k_proj", "v_proj", "o_proj")]
    q, kv = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim  # type: ignore[operator]
    return [("q_proj", f"qkv_proj.weight[0:{q}]"), ("k_proj", f"qkv_proj.weight[{q}:{q + kv}]"),
            ("v_proj", f"qkv_proj.weight[{q + kv}:{q + 2 * kv}]"), ("o_proj", "o_proj.weight")]


def hybrid_parameter_map(config: TransformerConfig, prefix: str = "model.") -> dict[str, Slot]:
    """Qwen3.5's keys (under `prefix`: "model." or the multimodal folder's "model.language_model.")
    -> their Slots: the k-th linear-attention layer is row k of `linear_layers`, the k-th
    full-attention layer row k of `layers`. Every RMSNorm but the linear attention's gated one
    scales by (1 + w): its weight is stored here as 1 + w."""
    names: dict[str, Slot] = {f"{prefix}embed_tokens.weight": Slot(("embed",), None, False),
                              f"{prefix}norm.weight": Slot(("final_norm", "weight"), None, False, 1.0)}
    counts = {"linear_attention": 0, "full_attention": 0}
    for i, kind in enumerate(config.kinds()):
        hf, j = f"{prefix}layers.{i}", counts[kind]
        counts[kind] += 1
        stack = "linear_layers" if kind == "linear_attention" else "layers"

        def at(*path: str, transposed: bool = False, offset: float = 0.0, j: int = j, stack: str = stack) -> Slot:
            return Slot((stack, *path), j, transposed, offset)

        names[f"{hf}.input_layernorm.weight"] = at("attn_norm", "weight", offset=1.0)
        names[f"{hf}.post_attention_layernorm.weight"] = at("mlp_norm", "weight", offset=1.0)
        for proj in ("gate_proj", "up_proj", "down_proj"):
            names[f"{hf}.mlp.{proj}.weight"] = at("mlp", proj, "kernel", transposed=True)
        if kind == "linear_attention":
            for proj in ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "out_proj"):
                names[f"{hf}.linear_attn.{proj}.weight"] = at("linear_attn", proj, "kernel", transposed=True)
            names[f"{hf}.linear_attn.conv1d.weight"] = at("linear_attn", "conv_weight")
            names[f"{hf}.linear_attn.dt_bias"] = at("linear_attn", "dt_bias")
            names[f"{hf}.linear_attn.A_log"] = at("linear_attn", "A_log")
            names[f"{hf}.linear_attn.norm.weight"] = at("linear_attn", "norm_weight")
        else:
            for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
                names[f"{hf}.self_attn.{proj}.weight"] = at("attn", proj, "kernel", transposed=True)
            for norm in ("q_norm", "k_norm"):
                names[f"{hf}.self_attn.{norm}.weight"] = at("attn", norm, "weight", offset=1.0)
    if not config.tie_embeddings:
        names["lm_head.weight"] = Slot(("lm_head", "kernel"), None, True)
    return names


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


def load_params(folder: Path, config: TransformerConfig,
                shardings: Callable[[nnx.State], Any] | None = None) -> Transformer:
    """A Transformer (a HybridTransformer for Qwen3.5) with `config` whose params are read from `folder`, cast to
    `config.param_dtype`.

    `shardings` maps the abstract param state to a same-shaped tree of
    `jax.sharding.Sharding`s (default: everything on the default device). Each
    device's shard is read from the safetensors files on its own (only the rows
    and columns it holds), so the host never holds a whole stacked parameter and
    no device ever holds the whole model unless its sharding says so.
    """
    files = weight_files(folder)
    prefix, head = text_layout(files)
    expected = parameter_map(config, prefix, head, fused=f"{prefix}layers.0.self_attn.qkv_proj.weight" in files)
    multimodal = prefix != TEXT_LAYOUTS[0][0]
    with ExitStack() as stack:
        names = _Tensors(files, {path: stack.enter_context(_open(path)) for path in set(files.values())}).names
    read_keys = {split_key(k)[0] for k in expected}
    unknown = sorted(
        k for k in names
        if k not in read_keys and not _IGNORED.fullmatch(k)
        and not (config.tie_embeddings and k == head)
        and not (multimodal and _OTHER_TOWERS.fullmatch(k))
        and not (config.hybrid and _IGNORED_HYBRID.fullmatch(k))
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


def save_params(model: Transformer, path: Path, fused: bool = False) -> None:
    """Write `model`'s params to one safetensors file under Hugging Face names,
    in the dtype they are stored in (`fused`: Phi-3's qkv_proj and gate_up_proj, see `parameter_map`)."""
    slots = dict(nnx.to_flat_state(nnx.state(model, nnx.Param)))
    arrays = {p: np.asarray(v[...]) for p, v in slots.items()}
    tensors = {}
    row_blocks: dict[str, list[tuple[int, np.ndarray]]] = defaultdict(list)
    for key, slot in parameter_map(model.config, fused=fused).items():
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
