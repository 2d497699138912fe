"""DAPO's soft overlong punishment: a reward on completion length in tokens.

With L_max the length limit and L_cache the buffer before it:
  0                                   if |y| <= L_max - L_cache
  ((L_max - L_cache) - |y|) / L_cache if L_max - L_cache < |y| <= L_max
  -1                                  if |y| > L_max
times `penalty_factor`. Lengths come from the learner's `completion_lengths`
field (tokens, EOS included), never from characters.
"""

from __future__ import annotations

from collections.abc import Sequence


def overlong_shaping(length_tokens: int, *, max_tokens: int, cache_tokens: int) -> float:
    """The unscaled shaping term for one completion of `length_tokens` tokens."""
    start = max_tokens - cache_tokens
    if length_tokens <= start:
        return 0.0
    if length_tokens <= max_tokens:
        return (start - length_tokens) / cache_tokens
    return -1.0


def overlong_penalty(*, max_tokens: int, cache_tokens: int, penalty_factor: float = 1.0):
    """A reward function applying `overlong_shaping` to every completion."""
    if not 0 < cache_tokens <= max_tokens:
        raise ValueError(
            f"overlong cache_tokens = {cache_tokens}: must be in (0, max_tokens = {max_tokens}]"
        )

    def overlong_penalty(
        prompts: Sequence[str], completions: Sequence[str], *, completion_lengths: Sequence[int], **_: object
    ) -> list[float]:
        """penalty_factor * shaping(|y|) in [-penalty_factor, 0], |y| in tokens."""
        return [
            penalty_factor * overlong_shaping(int(n), max_tokens=max_tokens, cache_tokens=cache_tokens)
            for n in completion_lengths
        ]

    return overlong_penalty
