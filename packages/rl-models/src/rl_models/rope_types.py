"""Rotary scalings beyond Llama 3's ("llama3" is `rl_models.config.RopeScaling`): the rope types
real Qwen3, Mistral and Gemma 3 folders set, as Hugging Face computes them.

Each is a frozen dataclass with `inv_freq(head_dim, theta) -> (inverse frequencies [Dh/2] float32,
attention factor)`: the factor multiplies cos and sin (so both queries and keys), as transformers
applies it. Only rope types whose frequencies are fixed at load time are here: "longrope" changes
its frequencies with the length of the running sequence and is refused (rl_models.hf.config);
"dynamic" NTK does too, but only past max_position_embeddings, and is read as `DynamicNTKRope`,
the default rope up to there.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


def default_inv_freq(head_dim: int, theta: float) -> np.ndarray:
    """theta^(-2i/Dh) for i < Dh/2, float32, as transformers computes it."""
    exponents = np.arange(0, head_dim, 2, dtype=np.int64).astype(np.float32) / np.float32(head_dim)
    return (1.0 / (np.float32(theta) ** exponents)).astype(np.float32)


@dataclass(frozen=True, kw_only=True)
class LinearRope:
    """Position interpolation ("linear"): every frequency divided by `factor` (Gemma 3's global layers)."""

    factor: float
    """Divisor of every frequency (positions count 1/factor as fast)."""

    def __post_init__(self) -> None:
        if not self.factor > 0:
            raise ValueError(f"LinearRope.factor={self.factor!r}: must be > 0")

    def inv_freq(self, head_dim: int, theta: float) -> tuple[np.ndarray, float]:
        return (default_inv_freq(head_dim, theta) / np.float32(self.factor)).astype(np.float32), 1.0


@dataclass(frozen=True, kw_only=True)
class DynamicNTKRope:
    """Dynamic NTK scaling ("dynamic"), exact up to `max_position_embeddings` positions.

    transformers (5.x, `dynamic_rope_update`) starts from the default frequencies and, once a call's
    longest position reaches max_position_embeddings, recomputes them with the base theta *
    (factor * L / max_position_embeddings - factor + 1) ^ (Dh / (Dh - 2)) for that call's length L,
    for every position of the call. So past the limit a full forward rotates its early positions
    otherwise than a decode step did when it cached their keys (on a 2-layer Llama limited to 8
    positions, a 24-token full forward and token-by-token decoding differ by 1.6 in the logits of
    positions 0-7): no training pass matches the engines there, nor transformers itself. Up to the
    limit it is the default rope bit for bit; `position_problem` says when a run would go past it
    (the trainer refuses such settings)."""

    factor: float
    """The NTK factor applied past the limit (never reached here)."""
    max_position_embeddings: int
    """Positions up to which the frequencies are the default ones (config.json's max_position_embeddings)."""

    def __post_init__(self) -> None:
        if not self.factor > 0:
            raise ValueError(f"DynamicNTKRope.factor={self.factor!r}: must be > 0")
        if not (isinstance(self.max_position_embeddings, int) and self.max_position_embeddings > 0):
            raise ValueError(f"DynamicNTKRope.max_position_embeddings={self.max_position_embeddings!r}: "
                             "must be a positive int")

    def inv_freq(self, head_dim: int, theta: float) -> tuple[np.ndarray, float]:
        return default_inv_freq(head_dim, theta), 1.0

    def position_problem(self, positions: int) -> str | None:
        """Why sequences of `positions` tokens are not computed exactly (None: they are)."""
        if positions <= self.max_position_embeddings:
            return None
        return (f"sequences of up to {positions} tokens pass the model's max_position_embeddings "
                f"({self.max_position_embeddings}), past which dynamic NTK rope recomputes every position's "
                "frequencies from the call's length (training and decoding would rotate keys differently); "
                f"keep prompt + completion within {self.max_position_embeddings} tokens, or set the folder's "
                "rope_scaling to a fixed type (\"yarn\" or \"linear\") for longer contexts")


@dataclass(frozen=True, kw_only=True)
class YarnRope:
    """YaRN (Peng et al. 2023, arXiv:2309.00071; Qwen3's long-context setting): frequencies that
    turn fewer than `beta_slow` times over the original context are interpolated (divided by
    `factor`), those that turn more than `beta_fast` times are kept, with a linear ramp between;
    cos and sin are scaled by the attention factor (0.1 ln(factor) + 1 unless given)."""

    factor: float
    """Context extension factor (4.0 for Qwen3's 32k -> 131k)."""
    original_max_position_embeddings: int
    """Context length the model was pre-trained with."""
    beta_fast: float = 32.0
    """Rotations over the original context above which a frequency is kept."""
    beta_slow: float = 1.0
    """Rotations below which a frequency is fully interpolated."""
    attention_factor: float | None = None
    """Multiplier of cos and sin; None: 0.1 ln(factor) + 1 (or the mscale ratio, see `mscale`)."""
    mscale: float | None = None
    """With `mscale_all_dim`, the default attention factor is mscale(factor, mscale) / mscale(factor, mscale_all_dim)."""
    mscale_all_dim: float | None = None
    """See `mscale`."""
    truncate: bool = True
    """Round the ramp's bounds outwards to whole dimensions (transformers' default)."""

    def __post_init__(self) -> None:
        if not self.factor > 0:
            raise ValueError(f"YarnRope.factor={self.factor!r}: must be > 0")
        if not (isinstance(self.original_max_position_embeddings, int) and self.original_max_position_embeddings > 0):
            raise ValueError(f"YarnRope.original_max_position_embeddings={self.original_max_position_embeddings!r}: "
                             "must be a positive int")

    def attention_scale(self) -> float:
        def mscale(scale: float, m: float = 1.0) -> float:
            return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

        if self.attention_factor is not None:
            return float(self.attention_factor)
        if self.mscale and self.mscale_all_dim:
            return float(mscale(self.factor, self.mscale) / mscale(self.factor, self.mscale_all_dim))
        return mscale(self.factor)

    def inv_freq(self, head_dim: int, theta: float) -> tuple[np.ndarray, float]:
        dim = head_dim
        original = self.original_max_position_embeddings

        def correction_dim(rotations: float) -> float:
            return (dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(theta))

        low, high = correction_dim(self.beta_fast), correction_dim(self.beta_slow)
        if self.truncate:
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, dim - 1)
        if low == high:
            high += 0.001  # as transformers: no zero-width ramp
        pos_freqs = np.float32(theta) ** (np.arange(0, dim, 2, dtype=np.int64).astype(np.float32) / np.float32(dim))
        extrapolation = (1.0 / pos_freqs).astype(np.float32)
        interpolation = (1.0 / (np.float32(self.factor) * pos_freqs)).astype(np.float32)
        ramp = np.clip((np.arange(dim // 2, dtype=np.float32) - np.float32(low)) / np.float32(high - low), 0, 1)
        keep = (1 - ramp).astype(np.float32)
        inv_freq = interpolation * (1 - keep) + extrapolation * keep
        return inv_freq.astype(np.float32), self.attention_scale()


FREQUENCY_ROPES = (LinearRope, DynamicNTKRope, YarnRope)
"""The rope settings that give their own frequencies (`inv_freq`); Llama 3's `RopeScaling` is
rl_models.config's and `rope_inv_freq` applies it."""
FrequencyRope = LinearRope | DynamicNTKRope | YarnRope
