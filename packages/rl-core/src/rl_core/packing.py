"""Sequence packing for the log-prob and update passes.

Shapes: B completions, P prompt tokens, T completion tokens, R packed rows of
W tokens, D hidden.

Unpacked, every row of a pass is prompt bucket + completion width wide, however
short its prompt and completion: a long-tailed batch is mostly padding. Packed,
each sequence's real tokens (its prompt's, then its completion's up to the end
of its mask) sit one after another in rows of W tokens, several per row, each a
segment: positions restart at 0 per segment and attention never crosses a
segment boundary, so every real token sees exactly what it sees unpacked and
gets the same log-prob. The log-probs come back in the [B, T] layout (gathered
from the packed hidden states), so losses, aggregation and advantages do not
change, nor do their gradients.

The packing is planned on the host, where the lengths are known (first-fit
decreasing); `pack` returns the arrays a jitted pass takes. R is rounded up to
a power of two so that a run compiles few shapes.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np


class Packed(NamedTuple):
    """Sequences packed into rows (see the module docstring)."""

    tokens: jax.Array  # [R, W] int32 (0 where no segment)
    positions: jax.Array  # [R, W] int32, restarting at 0 in each segment
    segments: jax.Array  # [R, W] int32: 0 = padding, k >= 1 = the row's k-th sequence
    index: jax.Array  # [B, T] int32: flat index r * W + w of the token that predicts completion token t

    def attention_mask(self) -> jax.Array:
        """[R, W, W]: causal within each segment; padding attends to nothing."""
        seg = self.segments
        w = seg.shape[1]
        causal = jnp.tril(jnp.ones((w, w), bool))
        return causal[None] & (seg[:, :, None] == seg[:, None, :]) & (seg[:, None, :] > 0)


def _first_fit_decreasing(lengths: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray]:
    """(row, offset) of each sequence of `lengths` in rows of `width` tokens."""
    row = np.zeros(len(lengths), np.int32)
    offset = np.zeros(len(lengths), np.int32)
    used: list[int] = []  # tokens taken in each row so far
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        n = int(lengths[i])
        if n == 0:
            continue
        for r, taken in enumerate(used):
            if taken + n <= width:
                break
        else:
            r = len(used)
            used.append(0)
        row[i], offset[i] = r, used[r]
        used[r] += n
    return row, offset


def packed_rows(used: int) -> int:
    """The row count a pass compiles for `used` rows: the next power of two."""
    return 1 << max(used - 1, 0).bit_length()


def pack(prompt_tokens: np.ndarray, prompt_mask: np.ndarray, completion_tokens: np.ndarray,
         completion_mask: np.ndarray, *, width: int | None = None, rows: int | None = None) -> Packed:
    """Pack each row's real prompt tokens and its completion up to the last token of
    `completion_mask` into rows of `width` tokens (default P + T, which always fits).

    `rows` (default: the rows used, rounded up to a power of two) must hold them all.
    A completion with an empty mask packs nothing; its log-probs are placeholders,
    masked out as they are unpacked.
    """
    prompt_mask = np.asarray(prompt_mask) > 0
    completion_mask = np.asarray(completion_mask) > 0
    b, p = prompt_mask.shape
    t = completion_mask.shape[1]
    width = p + t if width is None else width
    prompt_len = prompt_mask.sum(axis=1)
    if (prompt_len == 0).any():
        raise ValueError(f"prompt rows {np.flatnonzero(prompt_len == 0).tolist()} have no token to pack")
    ends = np.where(completion_mask.any(axis=1), t - np.argmax(completion_mask[:, ::-1], axis=1), 0)
    lengths = np.where(ends > 0, prompt_len + ends, 0)
    if lengths.max(initial=0) > width:
        raise ValueError(f"a sequence of {lengths.max()} tokens does not fit packed rows of {width}")
    row, offset = _first_fit_decreasing(lengths, width)
    used = int(row[lengths > 0].max(initial=-1)) + 1
    rows = packed_rows(used) if rows is None else rows
    if used > rows:
        raise ValueError(f"{b} sequences need {used} packed rows of {width} tokens; {rows} were given")

    tokens = np.zeros((rows, width), np.int32)
    positions = np.zeros((rows, width), np.int32)
    segments = np.zeros((rows, width), np.int32)
    index = np.zeros((b, t), np.int32)
    count = np.zeros(rows, np.int32)
    for i in np.flatnonzero(lengths):
        r, o, n, pl = row[i], offset[i], lengths[i], prompt_len[i]
        seq = np.concatenate([np.asarray(prompt_tokens[i])[prompt_mask[i]], np.asarray(completion_tokens[i])[: ends[i]]])
        count[r] += 1
        tokens[r, o : o + n], positions[r, o : o + n], segments[r, o : o + n] = seq, np.arange(n), count[r]
        # completion token j is predicted by the token before it, at o + pl + j - 1
        index[i, : ends[i]] = r * width + o + pl - 1 + np.arange(ends[i])
    return Packed(tokens, positions, segments, index)


def padded_positions(packed: Packed) -> int:
    """Token positions of the packed rows that hold no token (the padding a pass computes on)."""
    return int((np.asarray(packed.segments) == 0).sum())
