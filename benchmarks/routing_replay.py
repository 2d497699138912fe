"""How far a bfloat16 rollout's log-probs are from a float32 trainer's on a tiny mixture of
experts, with and without replaying the rollout's routing, beside a dense model's gap.

Model level: the rollout is the model run in bfloat16 (weights and compute), the trainer the
same weights in float32, both through `Transformer.routed` (the learner's passes do not take a
replay yet). Per next-token log-prob over random sequences: the mean and largest |difference|,
the share of tokens whose ratio exp(difference) leaves [0.8, 1.2] (what PPO's clip would cut), and
the share of tokens any layer of the trainer routes differently from the rollout.

    uv run python benchmarks/routing_replay.py
"""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from rl_models.hf import load_hf_model

HF = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "hf"
ROWS, LENGTH = 64, 48


def next_token_logp(model, tokens, replay=None):
    """(log-prob of each next token [B, L-1], the routing's experts or None)."""
    b, l = tokens.shape
    positions = jnp.broadcast_to(jnp.arange(l), (b, l))
    mask = jnp.broadcast_to(jnp.tril(jnp.ones((l, l), bool)), (b, l, l))
    hidden, _, routing = jax.jit(lambda m, r: m.routed(tokens, positions, mask, replay=r))(model, replay)
    logp = jax.nn.log_softmax(model.logits(hidden[:, :-1]).astype(jnp.float32), axis=-1)
    picked = jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1)[..., 0]
    return np.asarray(picked), None if routing is None else routing.experts


def gap(rollout, trainer):
    d = trainer - rollout
    return (f"mean |dlogp| {np.abs(d).mean():.2e}  max {np.abs(d).max():.2e}  "
            f"clipped {np.mean(np.abs(np.exp(d) - 1) > 0.2):.4f}")


def main() -> None:
    tokens = jnp.asarray(np.random.default_rng(0).integers(3, 300, (ROWS, LENGTH)), jnp.int32)
    for name in ("qwen3", "qwen3_moe", "gpt_oss"):
        trainer = load_hf_model(HF / name)
        rollout = load_hf_model(HF / name, dtype="bfloat16", param_dtype="bfloat16")
        logp16, experts16 = next_token_logp(rollout, tokens)
        logp32, experts32 = next_token_logp(trainer, tokens)
        print(f"{name:10s} bf16 rollout vs f32 trainer, own routing:      {gap(logp16, logp32)}")
        if experts16 is None:
            continue
        differs = np.any(np.asarray(experts16 != experts32).any(-1), axis=0)[:, :-1]  # any layer, any choice
        replayed, _ = next_token_logp(trainer, tokens, experts16)
        print(f"{name:10s} bf16 rollout vs f32 trainer, rollout replayed: {gap(logp16, replayed)}")
        print(f"{name:10s} tokens routed differently in some layer: {differs.mean():.4f} "
              f"({int(differs.sum())} of {differs.size})")
        print(f"{name:10s}   on those tokens, own routing:  {gap(logp16[differs], logp32[differs])}")
        print(f"{name:10s}   on those tokens, replayed:     {gap(logp16[differs], replayed[differs])}")


if __name__ == "__main__":
    main()
