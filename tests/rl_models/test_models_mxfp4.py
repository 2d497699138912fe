"""MXFP4 dequantisation (gpt-oss's published expert weights) on hand-made blocks."""

import numpy as np
import pytest

from rl_models.hf.mxfp4 import dequantize_mxfp4


def test_each_byte_holds_two_codes_low_nibble_first_scaled_by_its_group():
    """Byte 0x21: codes 1 (+0.5) then 2 (+1.0); 0xF8: 8 (-0.0) then 15 (-6.0); 0x7A: 10 (-1.0)
    then 7 (+6.0). Scale 128 doubles (2^(128-127)), 125 quarters, 127 keeps."""
    blocks = np.zeros((2, 2, 16), np.uint8)  # [rows 2, groups 2, 16 bytes]
    blocks[0, 0, 0], blocks[0, 0, 15] = 0x21, 0xF8
    blocks[0, 1, 3] = 0x7A
    blocks[1, 0, 1] = 0x44  # codes 4, 4: +2.0, +2.0
    scales = np.asarray([[128, 125], [127, 0]], np.uint8)
    out = dequantize_mxfp4(blocks, scales)
    assert out.shape == (2, 64) and out.dtype == np.float32
    want = np.zeros((2, 64), np.float32)
    want[0, 0:2] = [1.0, 2.0]  # (0.5, 1.0) * 2
    want[0, 30:32] = [-0.0, -12.0]
    want[0, 32 + 6: 32 + 8] = [-0.25, 1.5]  # (-1.0, 6.0) / 4
    want[1, 2:4] = [2.0, 2.0]
    np.testing.assert_array_equal(out, want)
    assert np.signbit(out[0, 30])  # code 8 is negative zero


def test_leading_axes_are_kept_and_bad_shapes_are_refused():
    blocks = np.full((3, 4, 1, 16), 0x22, np.uint8)  # every code 2: +1.0
    out = dequantize_mxfp4(blocks, np.full((3, 4, 1), 127, np.uint8))
    assert out.shape == (3, 4, 32) and np.all(out == 1.0)
    with pytest.raises(ValueError, match=r"need shape scales \+ \[16\]"):
        dequantize_mxfp4(blocks, np.full((3, 4, 2), 127, np.uint8))
    with pytest.raises(ValueError, match="must be uint8"):
        dequantize_mxfp4(blocks.astype(np.int8), np.full((3, 4, 1), 127, np.uint8))
