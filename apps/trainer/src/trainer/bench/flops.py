"""Model FLOPs counted from the real tokens a phase processed, and the machine's float32 matmul peak.

FLOPs of a causal forward over a sequence of n real tokens, unembedding u of them,
whose hidden states are read at its last o positions:
    2 * W * n            W = matmul weights of the blocks (q, k, v, o, MLP) x layers
  + 4 * L * H * Dh * n(n+1)/2   attention scores and values (each query, each earlier key)
  + 2 * D * V * u       unembedding
  less, in the last block, the query side (q, o and the MLP, and the attention of those
  queries) of the n - o positions no output reads: they give only keys and values.
The embedding lookup, norms, rotary and softmax are not counted. A layered model (Gemma 4) counts
each layer's projections at its own head size, k and v only where a layer computes them, its
per-layer inputs' matmuls, and runs every position. A hybrid model (Qwen3.5) counts
its attention layers' scores only, and for each linear-attention layer and token 6 * Hv * Dk * Dv
(the state's read, delta-rule update and output: three [Dk, Dv] products per value head) plus
2 * K * C for the convolution; it runs every position of every block (no query side skipped).

Two counts, both of real tokens only (padding and rows decoded after their EOS never count):

model FLOPs (MFU's numerator, as PaLM defines it and RL frameworks report it): what the
  task costs the model, whatever the implementation skips. Training is 3 forwards (forward
  + backward) over every row's prompt and completion, each completion token unembedded;
  sampling is one forward over each prompt (once per group, unembedding its last token) and
  over every generated token fed back (KV cache: each position once).
needed FLOPs: only the work no output can do without, what this implementation runs. Scoring
  never feeds a completion's last token (a target only), reads from the last prompt token on
  (the last block's other queries skipped) and runs a prompt its group shares once per group
  (rl_core.policy.logprobs); the prefill reads only its last token.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from rl_models import TransformerConfig, model_class

# -- model FLOPs ------------------------------------------------------------------------


def block_matmul_weights(cfg: TransformerConfig) -> int:
    """W: weights of every matmul in the blocks (q, k, v, o projections and the SwiGLU MLP), all layers."""
    if cfg.hybrid:
        return _hybrid_block_weights(cfg)
    if cfg.layered:
        return _layered_block_weights(cfg)
    return cfg.num_layers * (query_side_weights(cfg) + 2 * cfg.hidden_size * cfg.num_kv_heads * cfg.head_dim)


def query_side_weights(cfg: TransformerConfig) -> int:
    """One block's matmul weights that act per query position: q, o and the MLP (not k, v); none
    for a hybrid or layered model, whose last block runs every position."""
    if cfg.hybrid or cfg.layered:
        return 0
    d, h, dh, f = cfg.hidden_size, cfg.num_heads, cfg.head_dim, cfg.mlp_hidden_size
    return d * h * dh + h * dh * d + 3 * d * f


def _hybrid_block_weights(cfg: TransformerConfig) -> int:
    """W of a hybrid model: attention layers (q with its gate, k, v, o), linear-attention layers
    (in_proj_qkv, in_proj_z, in_proj_a, in_proj_b, out_proj), the MLP of each: with experts
    (Qwen3.5-MoE) the router, the k experts a token runs and the shared expert with its gate."""
    d, h, dh, f, la = cfg.hidden_size, cfg.num_heads, cfg.head_dim, cfg.mlp_hidden_size, cfg.linear_attention
    assert la is not None
    q = (2 if cfg.attention_output_gate else 1) * d * h * dh
    attention = q + 2 * d * cfg.num_kv_heads * dh + h * dh * d
    keys, values = la.num_key_heads * la.key_head_dim, la.num_value_heads * la.value_head_dim
    linear = d * (2 * keys + values) + d * values + 2 * d * la.num_value_heads + values * d
    kinds = cfg.kinds()
    mlp = 3 * d * f
    if cfg.num_experts:
        assert cfg.moe_hidden_size is not None
        mlp = d * cfg.num_experts + cfg.experts_per_token * 3 * d * cfg.moe_hidden_size + (
            3 * d * f + d if cfg.shared_expert else 0)
    return kinds.count("full_attention") * attention + kinds.count("linear_attention") * linear + len(kinds) * mlp


def _layered_block_weights(cfg: TransformerConfig) -> int:
    """W of a layered model (Gemma 4): each layer's q and o at its own head size, k and v only where
    it computes them (k alone on a global layer with keys as values), the MLP, and with per-layer
    inputs each block's gate and projection and the model's projection of the embeddings; a sharing
    layer's MLP twice as wide with `wide_shared_mlp`."""
    d, h, f, p = cfg.hidden_size, cfg.num_heads, cfg.mlp_hidden_size, cfg.per_layer_input_size
    sources, windowed = cfg.kv_source(), cfg.windowed()
    total = cfg.num_layers * p * d if p else 0  # per_layer_model_projection: D -> layers * P
    for i in range(cfg.num_layers):
        kv, dh = cfg.layer_shape(i)
        own = 0 if sources[i] != i else (1 if cfg.keys_as_values and not windowed[i] else 2) * d * kv * dh
        wide = 2 if cfg.wide_shared_mlp and sources[i] != i else 1
        total += 2 * d * h * dh + own + 3 * d * f * wide + 2 * d * p
    return total


def linear_attention_token_flops(cfg: TransformerConfig) -> int:
    """Per token, all linear-attention layers: the recurrence (6 * Hv * Dk * Dv) and the convolution."""
    la = cfg.linear_attention
    if la is None:
        return 0
    channels = 2 * la.num_key_heads * la.key_head_dim + la.num_value_heads * la.value_head_dim
    per_layer = 6 * la.num_value_heads * la.key_head_dim * la.value_head_dim + 2 * la.conv_kernel_size * channels
    return cfg.kinds().count("linear_attention") * per_layer


def forward_flops(cfg: TransformerConfig, tokens: np.ndarray, unembedded: np.ndarray,
                  outputs: np.ndarray | None = None) -> float:
    """Model FLOPs of causal forwards over sequences of `tokens` real tokens each, unembedding
    `unembedded`, their hidden states read at the last `outputs` positions (None: all)."""
    n = np.asarray(tokens, np.float64)
    u = np.asarray(unembedded, np.float64)
    skipped = 0.0 if outputs is None else n - np.asarray(outputs, np.float64)  # the first n - o queries
    if cfg.hybrid or cfg.layered:  # every position of every block runs
        skipped = 0.0
    per_score = 4.0 * cfg.num_heads * (cfg.global_head_dim or cfg.head_dim)  # the full-attention layers' heads
    dense = 2.0 * (block_matmul_weights(cfg) * n - query_side_weights(cfg) * skipped)
    attention = per_score * (cfg.kinds().count("full_attention") * n * (n + 1) - skipped * (skipped + 1)) / 2
    attention = attention + linear_attention_token_flops(cfg) * n
    logits = 2.0 * cfg.hidden_size * cfg.vocab_size * u
    return float(np.sum(dense + attention + logits))


def sampling_flops(
    cfg: TransformerConfig, prompt_tokens: np.ndarray, generated: np.ndarray, num_samples: int = 1, *,
    needed: bool = True,
) -> float:
    """Sampling `num_samples` completions per prompt, as the sampler does it.

    Each prompt is prefilled once and unembeds its last position (the first
    token's logits, shared by its samples; `needed`: read there only); then each
    completion feeds back every generated token but the last, attending over the
    prompt and what came before, and unembeds each of them. prompt_tokens: [U] real
    tokens per prompt; generated: [U * num_samples] tokens per completion, prompt-major.
    """
    prompt_tokens = np.asarray(prompt_tokens)
    prompt = np.repeat(prompt_tokens, num_samples)
    fed = np.maximum(np.asarray(generated) - 1, 0)
    prefill = prefill_flops(cfg, prompt_tokens, needed=needed)
    # a completion's decode work: its whole sequence less the prompt's share of it
    return prefill + forward_flops(cfg, prompt + fed, fed) - forward_flops(cfg, prompt, np.zeros_like(prompt))


def prefill_flops(cfg: TransformerConfig, prompt_tokens: np.ndarray, *, needed: bool = True) -> float:
    """One forward over each prompt, unembedding its last token (`needed`: read there only)."""
    once = np.ones_like(np.asarray(prompt_tokens))
    return forward_flops(cfg, prompt_tokens, once, once if needed else None)


def scored_tokens(prompt_tokens: np.ndarray, completion_tokens: np.ndarray) -> np.ndarray:
    """Real tokens a scoring pass feeds in (rl_core.policy.logprobs.scoring_inputs): the prompt and every
    completion token but the last (nothing is predicted from it)."""
    return np.asarray(prompt_tokens) + np.maximum(np.asarray(completion_tokens) - 1, 0)


def scoring_flops(cfg: TransformerConfig, prompt_tokens: np.ndarray, completion_tokens: np.ndarray,
                  group_size: int = 1, *, needed: bool = True) -> float:
    """The forward that scores completions, each completion token unembedded. Model FLOPs
    (`needed=False`): over every row's prompt and completion. Needed: over `scored_tokens`, read
    at the state before each completion token (from the last prompt token on); with
    `group_size` > 1, each group of that many consecutive rows runs its (one) prompt once, read
    at its last token (rl_core.policy.logprobs.shared_prompt_hidden), the rows continuing from its cache."""
    prompt, completion = np.asarray(prompt_tokens), np.asarray(completion_tokens)
    if not needed:
        return forward_flops(cfg, prompt + completion, completion)
    flops = forward_flops(cfg, scored_tokens(prompt, completion), completion, completion)
    if group_size > 1:  # every row's prompt pass less its group's one
        flops -= (1 - 1 / group_size) * forward_flops(cfg, prompt, np.zeros_like(prompt), np.ones_like(prompt))
    return flops


def training_flops(cfg: TransformerConfig, prompt_tokens: np.ndarray, completion_tokens: np.ndarray,
                   group_size: int = 1, *, needed: bool = True) -> float:
    """Forward and backward (3 forwards) of `scoring_flops`."""
    return 3.0 * scoring_flops(cfg, prompt_tokens, completion_tokens, group_size, needed=needed)


def parameter_count(cfg: TransformerConfig) -> int:
    """Every parameter of the model (embeddings, norms and biases included)."""
    abstract = nnx.eval_shape(lambda: model_class(cfg)(cfg, rngs=nnx.Rngs(0)))
    return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(nnx.state(abstract, nnx.Param)))


# -- the matmul peak ---------------------------------------------------------------------


def matmul_rate(n: int, repeats: int, min_seconds: float = 0.0) -> float:
    """Best float32 FLOP/s of a jitted n x n @ n x n matmul over at least `repeats` runs and `min_seconds`."""
    ka, kb = jax.random.split(jax.random.PRNGKey(0))
    a = jax.random.normal(ka, (n, n), jnp.float32)
    b = jax.random.normal(kb, (n, n), jnp.float32)
    matmul = jax.jit(jnp.matmul)
    matmul(a, b).block_until_ready()  # compile
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < repeats or time.perf_counter() - start < min_seconds:
        times.append(timed(lambda: matmul(a, b).block_until_ready()))
    return 2.0 * n**3 / min(times)


def memory_rate(mebibytes: int = 256, repeats: int = 5) -> float:
    """Best bytes/s of a jitted pass that reads a float32 array of `mebibytes` and writes one as large
    (x + 1): the device memory's bandwidth as a program sees it (HBM on an accelerator), for the decode floor."""
    x = jnp.zeros((mebibytes * 2**18,), jnp.float32)
    bump = jax.jit(lambda a: a + 1.0)
    bump(x).block_until_ready()  # compile
    return 2.0 * x.nbytes / min(timed(lambda: bump(x).block_until_ready()) for _ in range(repeats))


def decode_floor_bytes(cfg: TransformerConfig, rows: int, prompt_slots: int, steps: int) -> float:
    """Bytes a static-engine decode step must read at least, on average over `steps` steps: the weights
    in the compute dtype (the decode loop holds them so) and the live KV cache of `rows` rows, whose
    live slots grow from the prompt's `prompt_slots` by one a step (every layer's keys and values)."""
    size = jnp.dtype(cfg.dtype).itemsize
    weights = parameter_count(cfg) * size
    per_slot = rows * 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * size
    return weights + per_slot * (prompt_slots + (steps + 1) / 2)


def matmul_peak(sizes: Sequence[int], repeats: int, min_seconds: float = 0.0) -> dict[str, Any]:
    """The best rate of each size and the peak: the best of them all."""
    rates = {str(n): matmul_rate(n, repeats, min_seconds) for n in sizes}
    return _peak(rates)


def _peak(rates: dict[str, float]) -> dict[str, Any]:
    best = max(rates, key=rates.__getitem__)
    return {"n": int(best), "flops_per_sec": rates[best], "by_size": rates}


def merge_peaks(*peaks: dict[str, Any]) -> dict[str, Any]:
    rates = {n: max(p["by_size"][n] for p in peaks) for n in peaks[0]["by_size"]}
    return _peak(rates)


def timed(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start
