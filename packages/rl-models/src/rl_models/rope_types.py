"""Rotary scalings beyond Llama 3's ("llama3" is `rl_models.config.RopeScaling`): the rope types
real Qwen3, Mistral and Gemma 3 folders set, as Hugging Face computes them.

Each is a frozen dataclass with `inv_freq(head_dim, theta) -> (inverse frequencies [Dh/2] float32,
attention factor)`: the factor multiplies cos and sin (so both queries and keys), as transformers
applies it. Two change their frequencies with the length of the call (`CALL_LENGTH_ROPES`: dynamic
NTK and LongRoPE): each also has `call_inv_freq(head_dim, theta, seq_len)`, the frequencies of a
call whose longest position is seq_len - 1, as transformers' `dynamic_rope_update` recomputes them
at each forward; `inv_freq` gives those of a call within the short context.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import jax
import jax.numpy as jnp
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
    """Dynamic NTK scaling ("dynamic"): the default rope while a call's longest position stays
    within `max_position_embeddings`; past it, every position of the call rotates by the base
    theta * (factor * L / max_position_embeddings - factor + 1) ^ (Dh / (Dh - 2)) for the call's
    length L (transformers 5's `dynamic_rope_update` from a fresh model: a forward, a prefill and
    each decode step recompute it from their own longest position).

    So past the limit a full forward rotates its early positions otherwise than a decode step did
    when it cached their keys (on a 2-layer Llama limited to 8 positions, a 24-token full forward and
    token-by-token decoding differ by 1.6 in the logits of positions 0-7): no training pass matches
    the engines there, nor transformers itself; `position_problem` says when a run would go past it
    (the trainer refuses such settings)."""

    factor: float
    """The NTK factor applied past the limit."""
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

    def call_inv_freq(self, head_dim: int, theta: float, seq_len: jax.Array) -> tuple[jax.Array, float]:
        """The frequencies [Dh/2] of a call whose longest position is seq_len - 1 (traced int32 scalar),
        in float32 steps as transformers' `_compute_dynamic_ntk_parameters` takes them."""
        f32, limit = jnp.float32, self.max_position_embeddings
        length = jnp.maximum(seq_len, limit).astype(f32)
        stretch = (f32(self.factor) * length / f32(limit) - f32(self.factor - 1)) ** f32(head_dim / (head_dim - 2))
        base = f32(theta) * stretch
        exponents = jnp.asarray(np.arange(0, head_dim, 2, dtype=np.int64).astype(np.float32) / np.float32(head_dim))
        scaled = 1.0 / base ** exponents
        return jnp.where(seq_len > limit, scaled, jnp.asarray(default_inv_freq(head_dim, theta))), 1.0

    def position_problem(self, positions: int) -> str | None:
        """Why sequences of `positions` tokens are not computed alike in training and decoding (None: they are)."""
        if positions <= self.max_position_embeddings:
            return None
        return (f"sequences of up to {positions} tokens pass the model's max_position_embeddings "
                f"({self.max_position_embeddings}), past which dynamic NTK rope recomputes every position's "
                "frequencies from the call's length (training and decoding would rotate keys differently); "
                f"keep prompt + completion within {self.max_position_embeddings} tokens, or set the folder's "
                "rope_scaling to a fixed type (\"yarn\" or \"linear\") for longer contexts")


@dataclass(frozen=True, kw_only=True)
class LongRope:
    """LongRoPE ("longrope"; Phi-3, Phi-4-mini): each frequency theta^(-2i/Dh) divided by its own
    factor, `short_factor` while a call's longest position stays within
    `original_max_position_embeddings`, `long_factor` for a call past it (all of that call's
    positions, as transformers' `dynamic_rope_update` picks them per forward); cos and sin times
    the attention factor either way.

    A sequence that crosses the limit while it is decoded has its earlier keys rotated with the short
    factors and a training pass over it rotates them with the long ones (as in transformers):
    `position_problem` says when a run could do that."""

    short_factor: tuple[float, ...]
    """Per-frequency divisors [rotary dims / 2] within the original context."""
    long_factor: tuple[float, ...]
    """Per-frequency divisors [rotary dims / 2] past it."""
    original_max_position_embeddings: int
    """The pre-training context (4096 for Phi-4-mini)."""
    max_position_embeddings: int
    """The extended context (131072 for Phi-4-mini); with no `factor`, factor = this / the original."""
    factor: float | None = None
    """The extension factor the default attention factor is computed from (None: see max_position_embeddings)."""
    attention_factor: float | None = None
    """Multiplier of cos and sin; None: sqrt(1 + ln(factor) / ln(original)) (1 when factor <= 1)."""

    def __post_init__(self) -> None:
        for name in ("short_factor", "long_factor"):
            value = tuple(float(x) for x in getattr(self, name))
            if not value or not all(x > 0 for x in value):
                raise ValueError(f"LongRope.{name}={getattr(self, name)!r}: must be a non-empty list of numbers > 0")
            object.__setattr__(self, name, value)
        if len(self.short_factor) != len(self.long_factor):
            raise ValueError(f"LongRope.long_factor has {len(self.long_factor)} entries: must have as many as "
                             f"short_factor ({len(self.short_factor)})")
        for name in ("original_max_position_embeddings", "max_position_embeddings"):
            value = getattr(self, name)
            if not (isinstance(value, int) and not isinstance(value, bool) and value > 0):
                raise ValueError(f"LongRope.{name}={value!r}: must be a positive int")

    def attention_scale(self) -> float:
        if self.attention_factor is not None:
            return float(self.attention_factor)
        factor = self.factor if self.factor is not None else (
            self.max_position_embeddings / self.original_max_position_embeddings)
        if factor <= 1.0:
            return 1.0
        return math.sqrt(1 + math.log(factor) / math.log(self.original_max_position_embeddings))

    def _scaled(self, head_dim: int, theta: float, factors: tuple[float, ...]) -> np.ndarray:
        if len(factors) != head_dim // 2:
            raise ValueError(f"LongRope factors have {len(factors)} entries: the {head_dim} rotary dims need "
                             f"{head_dim // 2}")
        exponents = np.arange(0, head_dim, 2, dtype=np.int64).astype(np.float32) / np.float32(head_dim)
        return (1.0 / (np.asarray(factors, np.float32) * np.float32(theta) ** exponents)).astype(np.float32)

    def inv_freq(self, head_dim: int, theta: float) -> tuple[np.ndarray, float]:
        return self._scaled(head_dim, theta, self.short_factor), self.attention_scale()

    def call_inv_freq(self, head_dim: int, theta: float, seq_len: jax.Array) -> tuple[jax.Array, float]:
        """The frequencies [Dh/2] of a call whose longest position is seq_len - 1 (traced int32 scalar)."""
        short, long = (jnp.asarray(self._scaled(head_dim, theta, f)) for f in (self.short_factor, self.long_factor))
        return jnp.where(seq_len > self.original_max_position_embeddings, long, short), self.attention_scale()

    def position_problem(self, positions: int) -> str | None:
        """Why sequences of `positions` tokens could be rotated otherwise in training than in decoding."""
        if positions <= self.original_max_position_embeddings:
            return None
        return (f"sequences of up to {positions} tokens pass the model's original_max_position_embeddings "
                f"({self.original_max_position_embeddings}), past which LongRoPE switches from its short to its long "
                "factors for every position of a call (a sequence that crosses it while decoding keeps keys rotated "
                "with the short factors, which its training pass rotates with the long ones); keep prompt + "
                f"completion within {self.original_max_position_embeddings} tokens")


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


@dataclass(frozen=True, kw_only=True)
class ProportionalRope:
    """Proportional RoPE ("proportional"; Gemma 4's global layers): the default frequencies
    theta^(-2i/Dh) over the whole head for the first partial_rotary_factor * Dh / 2 pairs, and 0
    (no turn) for the rest, all divided by `factor`. Unlike a partial rotary, the exponents count
    the whole head's Dh and the turned pairs are (i, i + Dh/2) of the whole head."""

    partial_rotary_factor: float
    """The fraction of the head's frequency pairs that turn."""
    factor: float = 1.0
    """Divisor of every frequency."""

    def __post_init__(self) -> None:
        if not 0 < self.partial_rotary_factor <= 1:
            raise ValueError(f"ProportionalRope.partial_rotary_factor={self.partial_rotary_factor!r}: must be in (0, 1]")
        if not self.factor > 0:
            raise ValueError(f"ProportionalRope.factor={self.factor!r}: must be > 0")

    def inv_freq(self, head_dim: int, theta: float) -> tuple[np.ndarray, float]:
        angles = int(self.partial_rotary_factor * head_dim // 2)
        exponents = np.arange(0, 2 * angles, 2, dtype=np.int64).astype(np.float32) / np.float32(head_dim)
        turned = (1.0 / (np.float32(theta) ** exponents)).astype(np.float32)
        freq = np.concatenate([turned, np.zeros(head_dim // 2 - angles, np.float32)])
        return (freq / np.float32(self.factor)).astype(np.float32), 1.0


FREQUENCY_ROPES = (LinearRope, DynamicNTKRope, YarnRope, LongRope, ProportionalRope)
"""The rope settings that give their own frequencies (`inv_freq`); Llama 3's `RopeScaling` is
rl_models.config's and `rope_inv_freq` applies it."""
FrequencyRope = LinearRope | DynamicNTKRope | YarnRope | LongRope | ProportionalRope
CALL_LENGTH_ROPES = (DynamicNTKRope, LongRope)
"""The rope settings whose frequencies depend on a call's longest position (`call_inv_freq`)."""
