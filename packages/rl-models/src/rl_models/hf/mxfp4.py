"""MXFP4 weights (gpt-oss's expert kernels as published) dequantised to floats at load.

A tensor stored as MXFP4 comes as two: `<name>_blocks` [..., rows, G, 16] uint8, each byte two
4-bit E2M1 codes (the low nibble first), and `<name>_scales` [..., rows, G] uint8, one shared
power-of-two exponent per group of 32 values, biased by 127 (OCP Microscaling format). A row's
values are its G groups of 32 codes each, in order, each group times 2^(scale - 127).
"""

from __future__ import annotations

import numpy as np

E2M1_VALUES = np.asarray([+0.0, +0.5, +1.0, +1.5, +2.0, +3.0, +4.0, +6.0,
                          -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0], np.float32)
"""The 16 values of a 4-bit E2M1 code (sign, 2 exponent bits, 1 mantissa bit)."""


def dequantize_mxfp4(blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """float32 [..., rows, G * 32] of MXFP4 `blocks` [..., rows, G, 16] uint8 and `scales`
    [..., rows, G] uint8 (see the module docstring); a shape mismatch is a ValueError."""
    blocks, scales = np.asarray(blocks), np.asarray(scales)
    if blocks.dtype != np.uint8 or scales.dtype != np.uint8:
        raise ValueError(f"MXFP4 blocks and scales must be uint8 (got {blocks.dtype} and {scales.dtype})")
    if blocks.ndim < 2 or blocks.shape[-1] != 16 or blocks.shape[:-1] != scales.shape:
        raise ValueError(f"MXFP4 blocks {list(blocks.shape)} need shape scales + [16] (scales {list(scales.shape)})")
    codes = np.stack([blocks & 0x0F, blocks >> 4], axis=-1)  # [..., G, 16, 2]: low nibble first
    values = E2M1_VALUES[codes].reshape(*blocks.shape[:-1], 32)
    values = np.ldexp(values, scales.astype(np.int32)[..., None] - 127)
    return values.reshape(*scales.shape[:-1], scales.shape[-1] * 32)
