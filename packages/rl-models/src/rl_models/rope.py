"""Rotary position embeddings, as Hugging Face computes them ("rotate_half" convention,
the "llama3" rope_scaling rule included; linear and YaRN in rl_models.rope_types).

A model may give its layers different rotary tables (Gemma 3's local theta on its windowed
layers, SmolLM3's layers without positions): `rope_tables` computes each distinct table once
per forward pass and `layer_tables` says which one each layer reads."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from rl_models.config import RopeScaling, TransformerConfig
from rl_models.rope_types import CALL_LENGTH_ROPES, FREQUENCY_ROPES, FrequencyRope, default_inv_freq

GLOBAL, LOCAL, NONE = "global", "local", "none"
"""The rotary tables a layer may read: the model's (scaled) rope, the windowed layers' own
theta, or none (cos 1, sin 0: the identity, exactly)."""


def layer_tables(config: TransformerConfig) -> tuple[str, ...]:
    """Which rotary table each layer reads (GLOBAL, LOCAL or NONE)."""
    nope = set(config.nope_layers)
    local = config.rope_local_theta is not None
    return tuple(NONE if i in nope else LOCAL if local and windowed else GLOBAL
                 for i, windowed in enumerate(config.windowed()))


def rope_tables(config: TransformerConfig, positions: jax.Array) -> dict[str, tuple[jax.Array, jax.Array]]:
    """(cos, sin) of each table some layer reads (see `layer_tables`) at positions [B, L], over the
    rotary dims (`config.rotary_dim`; `rotate` passes the rest of each head through). A rope whose
    frequencies follow the call's length (dynamic NTK, LongRoPE) takes them from the call's
    longest position, as transformers does per forward."""
    tables: dict[str, tuple[jax.Array, jax.Array]] = {}
    dim, scaling = config.rotary_dim, config.rope_scaling
    for kind in dict.fromkeys(layer_tables(config)):
        if kind == NONE:
            ones = jnp.ones((*positions.shape, 1, dim), jnp.float32)
            tables[kind] = (ones, jnp.zeros_like(ones))
        elif kind == LOCAL:
            tables[kind] = rope_cos_sin(positions, default_inv_freq(dim, config.rope_local_theta))
        elif isinstance(scaling, CALL_LENGTH_ROPES):
            seq_len = jnp.max(positions).astype(jnp.int32) + 1
            inv_freq, factor = scaling.call_inv_freq(dim, config.rope_theta, seq_len)
            tables[kind] = rope_cos_sin(positions, inv_freq, factor)
        else:
            inv_freq, factor = rope_frequencies(dim, config.rope_theta, scaling)
            tables[kind] = rope_cos_sin(positions, inv_freq, factor)
    return tables


def rope_frequencies(head_dim: int, theta: float, scaling: RopeScaling | FrequencyRope | None
                     ) -> tuple[np.ndarray, float]:
    """(inverse frequencies [Dh/2] float32, attention factor on cos and sin) of a rope setting."""
    if isinstance(scaling, FREQUENCY_ROPES):
        return scaling.inv_freq(head_dim, theta)
    return rope_inv_freq(head_dim, theta, scaling), 1.0


def rope_inv_freq(head_dim: int, theta: float, scaling: RopeScaling | None) -> np.ndarray:
    """Rotary inverse frequencies [Dh/2] in float32, as Hugging Face computes them
    (including the "llama3" rope_scaling rule)."""
    inv_freq = default_inv_freq(head_dim, theta)
    if scaling is None:
        return inv_freq
    old_len = scaling.original_max_position_embeddings
    low_freq_wavelen = old_len / scaling.low_freq_factor
    high_freq_wavelen = old_len / scaling.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = np.where(wavelen > low_freq_wavelen, inv_freq / scaling.factor, inv_freq)
    smooth = (old_len / wavelen - scaling.low_freq_factor) / (
        scaling.high_freq_factor - scaling.low_freq_factor
    )
    smoothed = (1 - smooth) * scaled / scaling.factor + smooth * scaled
    medium = ~(wavelen < high_freq_wavelen) & ~(wavelen > low_freq_wavelen)
    return np.where(medium, smoothed, scaled).astype(np.float32)


def rope_cos_sin(positions: jax.Array, inv_freq: np.ndarray | jax.Array, factor: float = 1.0
                 ) -> tuple[jax.Array, jax.Array]:
    """(cos, sin) [B, L, 1, Dh] float32 for positions [B, L], in the form `rotate` takes: cos
    over both halves of Dh, sin negated over the first; both times `factor` (YaRN's attention
    factor). Computed once per forward pass and shared by every layer."""
    freqs = positions.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq)  # [B, L, Dh/2]
    cos, sin = jnp.cos(freqs), jnp.sin(freqs)
    if factor != 1.0:
        cos, sin = cos * np.float32(factor), sin * np.float32(factor)
    return (jnp.concatenate([cos, cos], axis=-1)[:, :, None, :],
            jnp.concatenate([-sin, sin], axis=-1)[:, :, None, :])


def rotate(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """Rotate x [B, L, N, Dh] by (cos, sin) from `rope_cos_sin`; with cos narrower than Dh (partial
    rotary) only the first cos.shape[-1] dims turn and the rest pass through.

    Hugging Face's x * cos + rotate_half(x) * sin, with rotate_half(x) = (-x2, x1) taken as
    the halves swapped (a reverse over a [2, Dh/2] view) times the signed sin: the same
    products and sums, in one elementwise fusion each way. The split-and-concatenate form
    becomes slices, concatenations, pads and adds in the backward pass, which cost XLA:CPU
    5-6% of a tiny-qwen2 update.
    """
    r = cos.shape[-1]
    if r < x.shape[-1]:
        return jnp.concatenate([rotate(x[..., :r], cos, sin), x[..., r:]], axis=-1)
    x32 = x.astype(jnp.float32)
    *lead, dh = x.shape
    swapped = jnp.flip(x32.reshape(*lead, 2, dh // 2), axis=-2).reshape(x32.shape)
    return (x32 * cos + swapped * sin).astype(x.dtype)


LANES = 128
"""A TPU vector register's lanes: an array's minor dimension is laid out in tiles of 128 (the
lane-packed cache, rl_models.block.LaneKV, fills them with heads side by side)."""


def rotate_lanes(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """`rotate` of x [B, L, K, Dh] whose K * Dh fills whole groups of 128 lanes, with each head's
    halves swapped by a product with a permutation matrix over each group instead of `jnp.flip`:
    the same numbers (each swapped value is one input times 1, summed with zeros in float32).

    A flip inside a vector's lanes is a lane permute, and XLA:TPU lays such an array out with the rows
    in the lanes to make it cheap: a decode step's new keys so laid out made it keep the whole
    lane-packed key cache rows-minor, and copy each layer's keys into the attention's layout at every
    step (rl_models.block.LaneKV). As a product the keys stay lanes-minor, as the cache is."""
    *lead, heads, dh = x.shape
    if cos.shape[-1] < dh:  # partial rotary: the plain form
        return rotate(x, cos, sin)
    half, per = dh // 2, LANES // dh
    swap = np.zeros((dh, dh), np.float32)
    swap[np.arange(half) + half, np.arange(half)] = swap[np.arange(half), np.arange(half) + half] = 1
    group = np.kron(np.eye(per, dtype=np.float32), swap)  # [128, 128]: each of a group's heads its own swap
    x32 = x.astype(jnp.float32)
    groups = x.reshape(*lead, heads * dh // LANES, LANES)
    swapped = jnp.einsum("...jc,ce->...je", groups, jnp.asarray(group, x.dtype), preferred_element_type=jnp.float32,
                         precision=jax.lax.Precision.HIGHEST).reshape(*lead, heads * dh)
    flat = (*lead, heads * dh)
    out = (x32.reshape(flat) * jnp.broadcast_to(cos, x.shape).reshape(flat)
           + swapped * jnp.broadcast_to(sin, x.shape).reshape(flat))
    return out.astype(x.dtype).reshape(x.shape)


def apply_rope(x: jax.Array, positions: jax.Array, inv_freq: np.ndarray) -> jax.Array:
    """Rotate x [B, L, N, Dh] by positions [B, L] ("rotate_half" convention:
    the first and second halves of Dh are the two coordinates of each pair)."""
    return rotate(x, *rope_cos_sin(positions, inv_freq))
