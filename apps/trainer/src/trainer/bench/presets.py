"""`trainer bench`'s presets: the model, the batch and how the matmul peak is measured."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True, kw_only=True)
class BenchPreset:
    """One benchmark configuration."""

    model: str
    """rl_models preset name (character vocabulary)."""
    prompts: int
    """Prompts per step (B)."""
    group_size: int
    """Completions per prompt (G)."""
    max_new_tokens: int
    """Most tokens generated per completion."""
    digits: int = 2
    """Digits of the addition problems."""
    matmul_sizes: tuple[int, ...] = (512, 1024, 2048)
    """n of the n x n float32 matmuls that measure the peak."""
    matmul_repeats: int = 5
    """Timed runs per size, at least (the best counts)."""
    matmul_min_seconds: float = 0.5
    """Keep timing a size until this much time has passed (short runs get more tries)."""
    warmup_steps: int = 2
    """Untimed steps before the timed ones (the first compiles; at least 1)."""
    generate_repeats: int = 5
    """Timed runs of the prefill-only and full generation programs (the best counts)."""
    dtype: str = "float32"
    """Compute dtype of the model (bfloat16 for the accelerator presets)."""
    description: str = ""
    needs_model: bool = False
    """The preset is a real model's: `--model DIR` must give its folder (`model` is only a stand-in)."""


PRESETS: dict[str, BenchPreset] = {
    "tiny-qwen2": BenchPreset(
        model="tiny_qwen2",
        prompts=8,
        group_size=8,
        max_new_tokens=8,
        description="hidden 128, 4 layers, 4 heads, 2 KV heads, MLP 512, tied embeddings, character vocabulary; "
        "8 prompts x 8 completions of 2-digit additions, up to 8 new tokens, AdamW, beta 0",
    ),
    # Accelerator shapes (random weights, character vocabulary: the block matmuls and the
    # KV cache are the real models'; the unembedding is smaller). See benchmarks/accelerator_check.sh.
    "qwen2.5-0.5b-shape": BenchPreset(
        model="qwen2_0_5b_shape",
        prompts=16,
        group_size=8,
        max_new_tokens=256,
        matmul_sizes=(2048, 4096, 8192),
        dtype="bfloat16",
        description="Qwen2.5-0.5B blocks (hidden 896, 24 layers, 14/2 heads, MLP 4864), bfloat16 compute; "
        "16 prompts x 8 completions, up to 256 new tokens, AdamW, beta 0",
    ),
    "qwen2.5-1.5b-shape": BenchPreset(
        model="qwen2_1_5b_shape",
        prompts=16,
        group_size=8,
        max_new_tokens=256,
        matmul_sizes=(2048, 4096, 8192),
        dtype="bfloat16",
        description="Qwen2.5-1.5B blocks (hidden 1536, 28 layers, 12/2 heads, MLP 8960), bfloat16 compute; "
        "16 prompts x 8 completions, up to 256 new tokens, AdamW, beta 0",
    ),
    "long-generation": BenchPreset(
        model="tiny_qwen2",
        prompts=16,
        group_size=8,
        max_new_tokens=1024,
        warmup_steps=1,
        generate_repeats=1,
        description="hidden 128, 4 layers (tiny-qwen2), 16 prompts x 8 completions of up to 1024 new tokens: "
        "rollout at real lengths (an untrained policy rarely stops early, so most run to the maximum); "
        "compare engines with rollout.engine=static|paged (the prefill/decode split times the static program)",
    ),
    # A real model from a local folder (docs/real-models.md): its rollout and update against
    # their floors in benchmarks/real_model_floors.py.
    "smollm2-135m": BenchPreset(
        model="tiny",
        needs_model=True,
        prompts=4,
        group_size=4,
        max_new_tokens=64,
        warmup_steps=1,
        generate_repeats=2,
        description="SmolLM2-135M-Instruct from --model DIR (hidden 576, 30 layers, 9/3 heads, MLP 1536, tied "
        "embeddings, vocabulary 49152), float32; 4 prompts x 4 completions, up to 64 new tokens, AdamW, beta 0",
    ),
    "tiny": BenchPreset(
        model="tiny",
        prompts=2,
        group_size=4,
        max_new_tokens=4,
        matmul_sizes=(128, 256),
        matmul_repeats=3,
        matmul_min_seconds=0.05,
        warmup_steps=1,
        generate_repeats=2,
        description="the unit-test model (hidden 64, 2 layers), 2 prompts x 4 completions; for quick checks",
    ),
}
