"""A generic length penalty on completion text, measured in characters.

Characters (``len(str)``, Unicode code points), not tokens: this acts on the
decoded text any reward function sees. DAPO's overlong shaping, which has the
same shape but counts tokens against the sampler's limit, lives with DAPO.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

__all__ = ["length_penalty"]


def length_penalty(*, max_chars: int = 4_000, buffer_chars: int = 1_000) -> Callable[..., list[float]]:
    """A reward named ``length_penalty`` in [-1, 0] that penalises long completions linearly.

    With ``n = len(completion)`` and ``free = max_chars - buffer_chars``:
    0 if ``n <= free``; ``(free - n) / buffer_chars`` if ``free < n <= max_chars``
    (falling linearly to -1); -1 beyond ``max_chars``. ``buffer_chars=0`` is a
    hard step from 0 to -1 past ``max_chars``.
    """
    for name, value in (("max_chars", max_chars), ("buffer_chars", buffer_chars)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError(f"{name} must be a non-negative int, got {value!r}")
    if max_chars == 0 or buffer_chars > max_chars:
        raise ValueError(f"need 0 <= buffer_chars <= max_chars and max_chars > 0, got {buffer_chars=}, {max_chars=}")
    free_chars = max_chars - buffer_chars

    def penalty(num_chars: int) -> float:
        if num_chars <= free_chars:
            return 0.0
        if num_chars > max_chars:
            return -1.0
        return (free_chars - num_chars) / buffer_chars

    def length_penalty(prompts: Sequence[str], completions: Sequence[str], **_: object) -> list[float]:
        """In [-1, 0]: 0 up to ``max_chars - buffer_chars`` characters, linear to -1 at ``max_chars``, -1 beyond."""
        return [penalty(len(completion)) for completion in completions]

    return length_penalty
