"""LoRA (Hu et al. 2021, arXiv:2106.09685) and QLoRA (Dettmers et al. 2023,
arXiv:2305.14314) on the Transformer: frozen base, trained low-rank adapters.

A targeted projection computes y = x W + (alpha / r) (x A) B with A [in, r] and
B [r, out] as `nnx.LoRAParam` (B starts at zero, so a fresh adapter changes
nothing, bit for bit); a learner that finds LoRAParams trains only them. With
`quantize_base`, every block kernel is stored as int8, int4 or NF4 codes with
scales (see `rl_models.quant`) and dequantized where it is used.

Why not `qwix.apply_lora_to_model`: qwix creates adapters while the model runs
once, by intercepting `dot_general` inside each module. Here the blocks run under
`lax.scan` on modules re-made from stacked parameters, so adapters created there
would be per-layer tracers that die with the scan, and the decoding path's fused
q/k/v matmul would find no weight to adapt (adapters silently off in the
sampler). So adapters are made here with the stacked layout ([layers, in, r]) and
the kernels' logical axis names, and the quantization itself is qwix's.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from rl_models import quant
from rl_models.layers import Linear
from rl_models.transformer import Transformer

DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
"""Every attention and MLP projection (what PEFT calls "all-linear" minus lm_head)."""


def linears(model: nnx.Module) -> dict[str, Linear]:
    """Every Linear by module path, e.g. "layers/attn/q_proj" (the stacked blocks) or "lm_head"."""
    return {"/".join(map(str, path)): m for path, m in nnx.iter_modules(model) if isinstance(m, Linear)}


EXPERT_PROJECTIONS = ("gate_proj", "up_proj", "down_proj")
"""A mixture of experts' per-expert kernels ([E, in, out] arrays, not Linears): no adapters."""


def targeted(model: Transformer, targets: Sequence[str]) -> dict[str, Linear]:
    """The Linears whose module path ends in one of `targets` (regular expressions over
    whole path components: "q_proj", "attn/.*", "mlp/(up|down)_proj").

    In a mixture of experts only attention takes adapters: the experts' projections and the
    router do not, so a target naming only expert projections is passed over there (the default
    targets adapt q/k/v/o), and one that matches nothing at all is refused."""
    found = linears(model)
    chosen = {}
    experts = getattr(model.config, "num_experts", 0)
    for target in targets:
        hits = {p: m for p, m in found.items() if re.fullmatch(f"(?:.*/)?(?:{target})", p)}
        if not hits and experts and any(re.fullmatch(f"(?:.*/)?(?:{target})", f"mlp/{name}")
                                        for name in EXPERT_PROJECTIONS):
            continue
        if not hits:
            raise ValueError(f"LoRA target {target!r} matches no projection; the model has {sorted(found)}")
        chosen.update(hits)
    if not chosen:
        raise ValueError(f"LoRA targets {list(targets)} name only expert projections, which take no adapters "
                         f"in a mixture of experts; target attention: {sorted(p for p in found if '/attn/' in p)}")
    return dict(sorted(chosen.items()))


def _axes(var: nnx.Variable) -> tuple[str | None, ...]:
    return tuple(var.get_metadata("out_sharding", None) or (None,) * var.ndim)


def _units(var: nnx.Variable) -> tuple[int, ...]:
    return tuple(var.get_metadata("axis_units", None) or (1,) * var.ndim)


def add_adapters(model: Transformer, *, rank: int, alpha: float, targets: Sequence[str] = DEFAULT_TARGETS,
                 seed: int = 0) -> Transformer:
    """Give every targeted projection of `model` (in place; also returned) a rank-`rank` adapter.

    A is drawn as PEFT draws it (Kaiming-uniform with a = sqrt(5): U(-1/sqrt(in), 1/sqrt(in)));
    B is zero. Both are float32 and named like the kernel: A (..., in, None), B (..., None, out).
    """
    if rank < 1:
        raise ValueError(f"LoRA rank {rank}: must be >= 1")
    key = jax.random.key(seed)
    for i, (path, lin) in enumerate(targeted(model, targets).items()):
        if lin.lora_a is not None:
            raise ValueError(f"{path} already has an adapter")
        _new_adapter(lin, rank, jax.random.fold_in(key, i))
        lin.lora_scale = alpha / rank
    return model


def redraw_adapters(model: nnx.Module, *, seed: int) -> nnx.Module:
    """Give every adapter of `model` (in place; also returned) a fresh start of its rank: A drawn
    with `seed`, B zero (a critic's own adapters over a policy's projections, rl_models.value)."""
    key = jax.random.key(seed)
    adapted = [lin for lin in linears(model).values() if lin.lora_a is not None]
    for i, lin in enumerate(adapted):
        _new_adapter(lin, lin.lora_a.shape[-1], jax.random.fold_in(key, i))
    return model


def _new_adapter(lin: Linear, rank: int, key: jax.Array) -> None:
    """A (PEFT's Kaiming-uniform draw) and B = 0 for `lin`, named like its kernel."""
    *lead, n_in, n_out = lin.kernel.shape
    *lead_axes, in_axis, out_axis = _axes(lin.kernel)
    *lead_units, in_unit, out_unit = _units(lin.kernel)
    bound = 1.0 / math.sqrt(n_in)
    a = jax.random.uniform(key, (*lead, n_in, rank), jnp.float32, -bound, bound)
    lin.lora_a = nnx.LoRAParam(a, out_sharding=(*lead_axes, in_axis, None),
                               axis_units=(*lead_units, in_unit, 1), eager_sharding=False)
    lin.lora_b = nnx.LoRAParam(jnp.zeros((*lead, rank, n_out), jnp.float32),
                               out_sharding=(*lead_axes, None, out_axis),
                               axis_units=(*lead_units, 1, out_unit), eager_sharding=False)


def quantize_base(model: Transformer, qtype: str) -> Transformer:
    """Store every block projection's kernel (in place; also returned) as `qtype` codes
    plus scales; embeddings, norms, biases and an untied lm_head stay as they are."""
    for path, lin in linears(model).items():
        if not path.startswith(("layers/", "linear_layers/")) or lin.kernel_scale is not None:
            continue
        axes, units = _axes(lin.kernel), _units(lin.kernel)
        codes, scale = quant.quantize(lin.kernel[...], qtype)
        lin.kernel = nnx.Param(codes, out_sharding=axes, axis_units=units, eager_sharding=False)
        lin.kernel_scale = nnx.Param(scale, out_sharding=(*axes[:-2], None, axes[-1]),
                                     axis_units=(*units[:-2], 1, units[-1]), eager_sharding=False)
        lin.qtype = qtype
    return model


def has_adapters(model: nnx.Module) -> bool:
    return bool(jax.tree.leaves(nnx.state(model, nnx.LoRAParam)))


def adapter_count(model: nnx.Module) -> int:
    """Trainable adapter parameters."""
    return sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.LoRAParam)))


def merged_kernel(lin: Linear) -> jax.Array:
    """W + (alpha / r) A B in float32 (W dequantized when stored quantized)."""
    w = lin.kernel[...].astype(jnp.float32) if lin.qtype is None else quant.dequantize(
        lin.kernel[...], lin.kernel_scale[...], lin.qtype)
    if lin.lora_a is None:
        return w
    ab = jnp.matmul(lin.lora_a[...].astype(jnp.float32), lin.lora_b[...].astype(jnp.float32),
                    precision=jax.lax.Precision.HIGHEST)
    return w + lin.lora_scale * ab


def merge_adapters(model: Transformer) -> Transformer:
    """A plain Transformer (no adapters, nothing quantized) whose kernels are W + (alpha / r) A B,
    stored in the model's `param_dtype`: what `rl_models.hf.export_hf` writes."""
    graphdef, plain = nnx.split(nnx.eval_shape(lambda: type(model)(model.config, rngs=nnx.Rngs(0))))
    values = nnx.to_pure_dict(nnx.state(model, nnx.Param))
    adapted = linears(model)
    dtype = jnp.dtype(model.config.param_dtype)

    def fill(path, abstract):
        keys = tuple(str(getattr(k, "key", k)) for k in path)
        owner = "/".join(keys[:-1])
        if keys[-1] == "kernel" and owner in adapted:
            return merged_kernel(adapted[owner]).astype(dtype)
        node = values
        for k in keys:
            node = node[k]
        return jnp.asarray(node, abstract.dtype)

    filled = jax.tree_util.tree_map_with_path(fill, nnx.to_pure_dict(plain))
    return nnx.merge(graphdef, filled)
