"""Tokenizer protocol, left padding and shape buckets."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import numpy as np


@runtime_checkable
class Tokenizer(Protocol):
    @property
    def vocab_size(self) -> int: ...

    @property
    def pad_id(self) -> int: ...

    @property
    def eos_ids(self) -> tuple[int, ...]: ...

    def encode(self, text: str, add_bos: bool = False) -> list[int]: ...

    def decode(self, ids: Sequence[int], skip_special: bool = True) -> str: ...


def bucket(length: int, limit: int, *, smallest: int = 8) -> int:
    """The padded length for `length`: the next power of two >= smallest, capped at `limit`.

    A run then compiles one program per bucket, a handful in all, however
    prompt lengths vary from step to step.
    """
    if length > limit:
        raise ValueError(f"length {length} exceeds the limit {limit}")
    size = smallest
    while size < length:
        size *= 2
    return min(size, limit)


def left_pad(
    sequences: Sequence[Sequence[int]], *, pad_id: int, max_tokens: int, what: str = "prompt"
) -> tuple[np.ndarray, np.ndarray]:
    """Left-pad to a bucketed length: (tokens [B, P] int32, mask [B, P] float32)."""
    for i, seq in enumerate(sequences):
        if not seq:
            raise ValueError(f"{what} {i} is empty")
        if len(seq) > max_tokens:
            raise ValueError(f"{what} {i} has {len(seq)} tokens, more than max_prompt_tokens={max_tokens}")
    width = bucket(max(len(s) for s in sequences), max_tokens)
    tokens = np.full((len(sequences), width), pad_id, np.int32)
    mask = np.zeros((len(sequences), width), np.float32)
    for i, seq in enumerate(sequences):
        tokens[i, width - len(seq) :] = seq
        mask[i, width - len(seq) :] = 1.0
    return tokens, mask


def encode_prompts(tokenizer: Tokenizer, texts: Sequence[str], *, max_tokens: int) -> tuple[np.ndarray, np.ndarray]:
    """Left-padded prompt tokens and mask [len(texts), P], each prompt starting with its BOS.

    The one way prompts become tokens, in training, evaluation and the warm start alike.
    """
    return left_pad([tokenizer.encode(t, add_bos=True) for t in texts], pad_id=tokenizer.pad_id, max_tokens=max_tokens)


def decode_completions(tokenizer: Tokenizer, tokens: np.ndarray, mask: np.ndarray) -> list[str]:
    """Completion texts [B] from tokens [B, T]: the tokens under the mask, EOS dropped."""
    eos = set(tokenizer.eos_ids)
    keep = np.asarray(mask) > 0
    return [
        tokenizer.decode([t for t in row[k].tolist() if t not in eos])
        for row, k in zip(np.asarray(tokens), keep, strict=True)
    ]
