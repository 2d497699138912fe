"""Sequence packing for the log-prob and update passes.

Shapes: B completions, P prompt tokens, T completion tokens, S row shards, R packed
rows per shard of W tokens, D hidden.

Unpacked, every row of a pass is prompt bucket + completion width wide, however
short its prompt and completion: a long-tailed batch is mostly padding. Packed,
each sequence's real tokens (its prompt's, then its completion's up to the end
of its mask) sit one after another in rows of W tokens, several per row, each a
segment: positions restart at 0 per segment and attention never crosses a
segment boundary, so every real token sees exactly what it sees unpacked and
gets the same log-prob. The log-probs come back in the [B, T] layout (gathered
from the packed hidden states), so losses, aggregation and advantages do not
change, nor do their gradients.

On a mesh the B rows are split over S devices (data x fsdp) in S blocks, and each
block is packed into its own R rows: packed rows [S * R, W] split the same way, so
every device packs, runs and unpacks its own sequences. The index a completion
token reads its hidden state from is local to its block (rl_core.packed.unpack gathers within
each block), so no device ever needs another's activations.

The packing is planned on the host, where the lengths are known (first-fit
decreasing); `pack` returns the arrays a jitted pass takes. R is rounded up to one
of four steps an octave (`packed_rows`), and a run reuses a larger R it already
compiled (`reused_rows`), so that it compiles few shapes.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from rl_core.packed import Packed


def _first_fit_decreasing(lengths: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray, int]:
    """(row, offset) of each sequence of `lengths` in rows of `width` tokens, and the rows used."""
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
    return row, offset, len(used)


def packed_rows(used: int, cap: int | None = None) -> int:
    """The row count a pass compiles for `used` rows: the next of 4 steps an octave (1, 2, 3, 4, 5,
    6, 7, 8, 10, 12, 14, 16, 20, ...), at most `cap`, the sequence count (one per row always fits).

    Four shapes an octave, not one: 128 completions that pack into 90 rows run 96, where the next
    power of two, 128, is the unpacked batch again (a program per shape, and few shapes in a run)."""
    used = max(used, 1)
    step = 1 << max((used - 1).bit_length() - 3, 0)
    rows = -(-used // step) * step
    return rows if cap is None else min(rows, max(cap, 1))


class _Plan(NamedTuple):
    prompt_len: np.ndarray  # [B]
    ends: np.ndarray  # [B] completion tokens packed (up to the mask's last real token)
    row: np.ndarray  # [B] row within the sequence's block
    offset: np.ndarray  # [B]
    used: int  # most rows any block uses


def _plan(prompt_mask: np.ndarray, completion_mask: np.ndarray, width: int, shards: int) -> _Plan:
    prompt_mask = np.asarray(prompt_mask) > 0
    completion_mask = np.asarray(completion_mask) > 0
    b, t = completion_mask.shape
    if b % shards:
        raise ValueError(f"{b} sequences cannot be split into {shards} equal blocks")
    prompt_len = prompt_mask.sum(axis=1)
    if (prompt_len == 0).any():
        raise ValueError(f"prompt rows {np.flatnonzero(prompt_len == 0).tolist()} have no token to pack")
    ends = np.where(completion_mask.any(axis=1), t - np.argmax(completion_mask[:, ::-1], axis=1), 0)
    lengths = np.where(ends > 0, prompt_len + ends, 0)
    if lengths.max(initial=0) > width:
        raise ValueError(f"a sequence of {lengths.max()} tokens does not fit packed rows of {width}")
    row, offset, used = np.zeros(b, np.int32), np.zeros(b, np.int32), 0
    block = b // shards
    for s in range(shards):
        cut = slice(s * block, (s + 1) * block)
        row[cut], offset[cut], n = _first_fit_decreasing(lengths[cut], width)
        used = max(used, n)
    return _Plan(prompt_len, ends, row, offset, used)


def pack(prompt_tokens: np.ndarray, prompt_mask: np.ndarray, completion_tokens: np.ndarray,
         completion_mask: np.ndarray, *, width: int | None = None, rows: int | None = None,
         shards: int = 1) -> Packed:
    """Pack each row's real prompt tokens and its completion up to the last token of
    `completion_mask` into rows of `width` tokens (default P + T, which always fits), each
    of the `shards` equal blocks of rows into its own `rows` rows (default: the most any
    block uses, rounded up to a power of two).

    A completion with an empty mask packs nothing; its log-probs are placeholders,
    masked out as they are unpacked.
    """
    b, p = np.shape(prompt_mask)
    width = p + np.shape(completion_mask)[1] if width is None else width
    plan = _plan(prompt_mask, completion_mask, width, shards)
    rows = packed_rows(plan.used, b // shards) if rows is None else rows
    if plan.used > rows:
        raise ValueError(f"{b // shards} sequences need {plan.used} packed rows of {width} tokens; {rows} were given")
    return _fill(plan, np.asarray(prompt_tokens), np.asarray(prompt_mask) > 0, np.asarray(completion_tokens),
                 width=width, rows=rows, shards=shards)


def _fill(plan: _Plan, prompt_tokens: np.ndarray, prompt_mask: np.ndarray, completion_tokens: np.ndarray, *,
          width: int, rows: int, shards: int) -> Packed:
    b, t = completion_tokens.shape
    block = b // shards
    tokens = np.zeros((shards * rows, width), np.int32)
    positions = np.zeros((shards * rows, width), np.int32)
    segments = np.zeros((shards * rows, width), np.int32)
    index = np.zeros((b, t), np.int32)
    count = np.zeros(shards * rows, np.int32)
    for i in np.flatnonzero(plan.ends):
        r = i // block * rows + plan.row[i]  # the row in the whole array
        o, pl, end = plan.offset[i], plan.prompt_len[i], plan.ends[i]
        n = pl + end
        seq = np.concatenate([prompt_tokens[i][prompt_mask[i]], completion_tokens[i, :end]])
        count[r] += 1
        tokens[r, o : o + n], positions[r, o : o + n], segments[r, o : o + n] = seq, np.arange(n), count[r]
        # completion token j is predicted by the token before it, at o + pl + j - 1 of its block's rows
        index[i, :end] = plan.row[i] * width + o + pl - 1 + np.arange(end)
    return Packed(tokens, positions, segments, index)


def reused_rows(rows: int, compiled: set[tuple[int, ...]] | None, shape: tuple[int, ...] = ()) -> int:
    """`rows`, or the fewest rows of the packed shapes already `compiled` ((*shape, rows) tuples) that
    hold them; the pick is added to `compiled`.

    A packed pass compiles a program per row count; on a TPU a 0.5B update takes minutes to compile,
    so a step whose sequences pack into 80 rows after one that took 96 runs the 96-row program on
    padding rather than compile another (the chip's 0.5B bench did not finish its warm-up steps in 7
    minutes of such compiles). `shape`: what else fixes the program (micro-batches, sequences in
    each, row width)."""
    if compiled is None:
        return rows
    rows = min((r for *s, r in compiled if tuple(s) == shape and r >= rows), default=rows)
    compiled.add((*shape, rows))
    return rows


def pack_micro_batches(prompt_tokens: np.ndarray, prompt_mask: np.ndarray, completion_tokens: np.ndarray,
                       completion_mask: np.ndarray, *, shards: int, compiled: set[tuple[int, ...]] | None = None) -> Packed:
    """`pack` of every micro-batch of [M, mb, ...] stacks, all into the same number of rows
    (the most any micro-batch's block needs, or a larger count already `compiled`: `reused_rows`):
    a Packed whose arrays lead with M."""
    m, mb, p = np.shape(prompt_mask)
    width = p + np.shape(completion_mask)[2]
    plans = [_plan(prompt_mask[k], completion_mask[k], width, shards) for k in range(m)]
    rows = reused_rows(packed_rows(max(plan.used for plan in plans), mb // shards), compiled, (m, mb, width))
    packs = [_fill(plan, np.asarray(prompt_tokens[k]), np.asarray(prompt_mask[k]) > 0,
                   np.asarray(completion_tokens[k]), width=width, rows=rows, shards=shards)
             for k, plan in enumerate(plans)]
    return Packed(*(np.stack(x) for x in zip(*packs, strict=True)))


def padded_positions(packed: Packed) -> int:
    """Token positions of the packed rows that hold no token (the padding a pass computes on)."""
    return int((np.asarray(packed.segments) == 0).sum())
