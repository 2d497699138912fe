"""The transformer's parameterised pieces: logically named parameters, `Linear` (quantized
kernels and LoRA adapters included), several Linears as one matmul, and RMSNorm.

Every parameter carries logical axis names (`out_sharding`) that a rules table maps to
mesh axes (`rl_core.runtime.mesh`); the layers themselves need no mesh.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from rl_models.attention import target_platform
from rl_models.quant import dequantize
from rl_models.sharding import gathered

Axes = tuple[str | None, ...]


def param(value: jax.Array, axes: Axes, units: tuple[int, ...] | None = None) -> nnx.Param:
    """A parameter annotated with its logical axis names (one per dimension).

    `units` (metadata `axis_units`, default 1 each): a dimension may only be split in
    whole multiples of its unit, e.g. head_dim for the fused (heads x head_dim) output of
    q_proj, so tensor parallelism hands each device whole heads. Not sharded here (no
    eager sharding): whoever places the model maps the names to a mesh (see
    `rl_core.runtime.mesh`), so the model itself needs no mesh.
    """
    assert len(axes) == value.ndim, (axes, value.shape)
    units = units or (1,) * value.ndim
    assert len(units) == value.ndim, (units, value.shape)
    return nnx.Param(value, out_sharding=axes, axis_units=units, eager_sharding=False)


class Linear(nnx.Module):
    """y = x @ kernel (+ bias) (+ scale * (x @ lora_a) @ lora_b); kernel [in, out], stored
    in `param_dtype`, used in `dtype`.

    `rl_models.lora` may quantize the kernel (`kernel` then holds integer values and
    `kernel_scale` their scales, `qtype` says which code) and add low-rank adapters
    (`lora_a` [in, r], `lora_b` [r, out], both `nnx.LoRAParam`).
    """

    def __init__(self, in_features: int, out_features: int, *, axes: Axes, use_bias: bool,
                 dtype: jnp.dtype, param_dtype: jnp.dtype, rngs: nnx.Rngs, units: tuple[int, int] = (1, 1)):
        init = nnx.initializers.lecun_normal()
        self.kernel = param(init(rngs.params(), (in_features, out_features), param_dtype), axes, units)
        self.bias = param(jnp.zeros((out_features,), param_dtype), axes[1:], units[1:]) if use_bias else None
        self.dtype = dtype
        # data slots (not static attributes), so rl_models.lora can fill them in later
        self.kernel_scale: nnx.Param | None = nnx.data(None)
        self.qtype: str | None = None
        self.lora_a: nnx.LoRAParam | None = nnx.data(None)
        self.lora_b: nnx.LoRAParam | None = nnx.data(None)
        self.lora_scale = 0.0

    def weight(self) -> jax.Array:
        """The kernel [in, out] in the compute dtype (dequantized when it is stored quantized),
        in its matmul layout under a mesh (gathered over fsdp after the cast)."""
        if self.kernel_scale is None or self.qtype is None:
            w = self.kernel[...].astype(self.dtype)
        else:
            w = dequantize(self.kernel[...], self.kernel_scale[...], self.qtype).astype(self.dtype)
        return gathered(w, *trailing_axes(self.kernel, 2))

    def adapter(self, x2: jax.Array) -> jax.Array | None:
        """The adapters' term scale * (x2 @ A) @ B [N, out] for inputs x2 [N, in]; None without adapters.

        With B = 0 (fresh adapters) the term is exactly zero, so the output is the base's bit for bit.
        """
        if self.lora_a is None or self.lora_b is None:
            return None
        a, b = self.lora_a[...].astype(self.dtype), self.lora_b[...].astype(self.dtype)
        return ((x2 @ a) @ b) * jnp.asarray(self.lora_scale, self.dtype)

    def __call__(self, x: jax.Array) -> jax.Array:
        # One 2-D matmul over all leading dims: on CPU, XLA then computes the weight
        # gradient without transposing the [..., out] activations (~30% of a train step).
        w = self.weight()
        x2 = x.reshape(-1, x.shape[-1])
        y = _matmul_cpu(x2, w) if target_platform() == "cpu" else x2 @ w
        delta = self.adapter(x2)
        if delta is not None:
            y = y + delta
        y = y.reshape(*x.shape[:-1], w.shape[-1])
        if self.bias is not None:
            y = y + self.bias[...].astype(self.dtype)
        return y


@jax.custom_vjp
def _matmul_cpu(x2: jax.Array, w: jax.Array) -> jax.Array:
    """x2 [N, in] @ w [in, out] with autodiff's gradient, computed so that XLA:CPU runs the weight
    gradient through its matmul library. Autodiff's dw = x2^T dy contracts over the rows, the
    major axis of both operands; XLA:CPU runs that form as its own dot (about half the library's
    rate at tiny-qwen2's shapes). Here x2 is transposed first, behind an optimization barrier so
    that XLA does not fold the transpose back into the dot (tiny-qwen2 update 7% faster)."""
    return x2 @ w


def _matmul_cpu_fwd(x2: jax.Array, w: jax.Array) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
    return x2 @ w, (x2, w)


def _matmul_cpu_bwd(residuals: tuple[jax.Array, jax.Array], dy: jax.Array) -> tuple[jax.Array, jax.Array]:
    x2, w = residuals
    return dy @ w.T, jax.lax.optimization_barrier(x2.T) @ dy


_matmul_cpu.defvjp(_matmul_cpu_fwd, _matmul_cpu_bwd)


def trailing_axes(var: nnx.Variable, ndim: int) -> tuple[tuple[str | None, ...], tuple[int, ...]]:
    """The logical names and units of a parameter's last `ndim` axes (a stacked layer's
    parameter carries "layers" first; inside the layer scan its value has lost that axis)."""
    names = var.get_metadata("out_sharding", None) or (None,) * ndim
    units = var.get_metadata("axis_units", None) or (1,) * len(names)
    return tuple(names[-ndim:]), tuple(units[-ndim:])


FUSE_MAX_KERNEL_ELEMENTS = 1 << 18
"""`fused_linear` concatenates kernels of at most this many elements in all (1 MiB of float32)."""


def fused_linear(x: jax.Array, layers: tuple[Linear, ...]) -> jax.Array:
    """The outputs of several Linears on the same input, concatenated on the last
    axis, from ONE matmul over their concatenated kernels (the parameters stay
    separate); adapters add their own low-rank terms.

    Only small kernels are concatenated (at most FUSE_MAX_KERNEL_ELEMENTS): the
    concatenation copies the kernels at every call, which a decode step pays per token
    (SmolLM2-135M, 16 rows on CPU: 39 of a decode step's 430 thread-ms, see
    docs/results/2026-12-03-real-model-floors.md), while one matmul instead of several saves
    only per-operation overhead, which counts for small kernels alone. Larger ones run as
    separate matmuls (the outputs are the same)."""
    if sum(math.prod(lin.kernel.shape) for lin in layers) > FUSE_MAX_KERNEL_ELEMENTS:
        return jnp.concatenate([lin(x) for lin in layers], axis=-1)
    w = jnp.concatenate([lin.weight() for lin in layers], axis=1)
    x2 = x.reshape(-1, x.shape[-1])
    y = x2 @ w
    deltas = [lin.adapter(x2) for lin in layers]
    if any(d is not None for d in deltas):
        y = y + jnp.concatenate([
            d if d is not None else jnp.zeros((x2.shape[0], lin.kernel.shape[-1]), y.dtype)
            for d, lin in zip(deltas, layers, strict=True)
        ], axis=1)
    y = y.reshape(*x.shape[:-1], w.shape[-1])
    if any(lin.bias is not None for lin in layers):
        y = y + jnp.concatenate([
            lin.bias[...].astype(y.dtype) if lin.bias is not None
            else jnp.zeros((lin.kernel.shape[-1],), y.dtype)
            for lin in layers
        ])
    return y


class RMSNorm(nnx.Module):
    """Llama's RMSNorm: normalize in float32, cast back, then scale by `weight`. With
    `plus_one` (Gemma's), scale by (1 + weight) in float32 and cast after; the weight starts at 0."""

    def __init__(self, dim: int, *, eps: float, param_dtype: jnp.dtype, axis: str = "norm", plus_one: bool = False):
        self.weight = param((jnp.zeros if plus_one else jnp.ones)((dim,), param_dtype), (axis,))
        self.eps = eps
        self.plus_one = plus_one

    def __call__(self, x: jax.Array) -> jax.Array:
        x32 = x.astype(jnp.float32)
        y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        if self.plus_one:
            return (y * (1.0 + self.weight[...].astype(jnp.float32))).astype(x.dtype)
        return self.weight[...].astype(x.dtype) * y.astype(x.dtype)
