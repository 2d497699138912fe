"""Weight-only quantization of frozen kernels through qwix (QLoRA's frozen base).

A kernel [..., in, out] is stored as integer codes of the same shape plus float32
scales [..., in / tile, out]: one scale per output channel (int8, absmax over the
whole input axis), or per output channel and block of `tile` input rows (int4 and
NF4, as bitsandbytes' 64-element blocks), which keeps 4-bit error local. The codes
and scales are qwix's (`qwix.quantize`, `qwix.dequantize`); leading axes (the
stacked layers) each get their own scales.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import qwix
from qwix._src.core.qarray import QArray

QTYPES: dict[str, object] = {"int8": jnp.int8, "int4": jnp.int4, "nf4": "nf4"}
"""Names accepted by `model.quantize` -> qwix's code type."""
BLOCK = 64
"""Input rows per scale block for the 4-bit codes."""


def quantize(kernel: jax.Array, qtype: str) -> tuple[jax.Array, jax.Array]:
    """(codes, float32 scales) of `kernel` [..., in, out] in the code `qtype`."""
    if qtype not in QTYPES:
        raise ValueError(f"unknown quantization {qtype!r}; known: {sorted(QTYPES)}")
    n_in = kernel.shape[-2]
    channels = (*range(kernel.ndim - 2), kernel.ndim - 1)  # every axis but the input one
    tiled = {kernel.ndim - 2: BLOCK} if qtype != "int8" and n_in % BLOCK == 0 and n_in > BLOCK else {}
    q = qwix.quantize(kernel.astype(jnp.float32), QTYPES[qtype], channelwise_axes=channels, tiled_axes=tiled)
    return q.qvalue, q.scale


def dequantize(codes: jax.Array, scale: jax.Array, qtype: str) -> jax.Array:
    """The float32 kernel that `quantize` stored as (codes, scale)."""
    return qwix.dequantize(QArray(codes, scale, None, QTYPES[qtype]))
