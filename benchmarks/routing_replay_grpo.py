"""GRPO on a tiny mixture of experts with and without routing replay, with float32 and bfloat16
rollout weights: reward over the steps, and the engine/trainer mismatch each step measures.

The task is the conformance suite's (tests/algos/test_algo_conformance.py): single-digit sums
"a+b=" through the character tokenizer, rewarded by the share of digits in the completion (a
shaping reward an untrained policy gets signal from), 16 completions a step (4 prompts x 4), 8
tokens each. The policy: rl_models' tiny transformer with a mixture of experts in both layers (4
experts, 2 per token), from random weights. num_iterations = 2, so every step runs the behaviour
pass before its update: the trainer's float32 log-probs of the engine's tokens at the weights that
sampled them (replaying the engine's experts with algorithm.routing_replay=rollout). Per step, over
the real tokens: the mean and largest |trainer - engine| log-prob (drift/logp_abs_*) and the share of
tokens whose ratio exp(trainer - engine) leaves [0.8, 1.2], GRPO's clip range (`replay/clip_frac`).

    uv run python benchmarks/routing_replay_grpo.py [--steps 40] [--seeds 0 1 2]

prints one line per run and a table of means over seeds with their 95% t-intervals.
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import numpy as np
from flax import nnx

import rewards
import rl_models
from algo_grpo import GRPOConfig, GRPOLearner
from rl_core import Groups, Prompt, RolloutConfig, StepBatch, TrainingConfig

TOK = rl_models.CharTokenizer()
MODEL = rl_models.TransformerConfig.tiny(TOK.vocab_size, hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1,
                                         num_experts=4, experts_per_token=2, moe_hidden_size=32)
PROMPTS = [Prompt(f"{a}+{b}=", {"answer": str(a + b)}) for a in range(1, 10) for b in range(1, 10)]
CONFIGS = {  # name: (routing_replay, rollout weights dtype)
    "float32 rollout": ("off", None),
    "bfloat16 rollout": ("off", "bfloat16"),
    "bfloat16 rollout, replayed": ("rollout", "bfloat16"),
}
T_95 = {2: 12.71, 3: 4.30, 4: 3.18, 5: 2.78}  # two-sided 95% t quantiles by sample size


def digit_fraction(prompts, completions, **_):
    """The share of digits in each completion."""
    return [sum(c.isdigit() for c in text) / max(len(text), 1) for text in completions]


class MeasuredGRPO(GRPOLearner):
    """GRPO that also logs the share of real tokens whose trainer/engine ratio leaves the clip range."""

    def _examples_from(self, groups: Groups) -> StepBatch:
        batch = super()._examples_from(groups)
        ex = batch.example
        real = np.asarray(ex.completion_mask) > 0
        gap = (np.asarray(ex.old_logp) - np.asarray(ex.sampler_logp))[real]
        clipped = float(np.mean(np.abs(np.exp(gap) - 1) > 0.2)) if gap.size else 0.0
        return batch._replace(metrics={**batch.metrics, "replay/clip_frac": clipped})


def learner(replay: str, weights_dtype: str | None, seed: int) -> GRPOLearner:
    return MeasuredGRPO(
        GRPOConfig(group_size=4, beta=0.0, num_iterations=2, routing_replay=replay),
        policy=rl_models.Transformer(MODEL, rngs=nnx.Rngs(seed)),
        tokenizer=TOK,
        train_data=PROMPTS,
        training=TrainingConfig(prompts_per_step=4, learning_rate=0.02, seed=seed),
        rollout=RolloutConfig(max_new_tokens=8, max_prompt_tokens=8, weights_dtype=weights_dtype, seed=seed),
        reward_manager=rewards.RewardManager([digit_fraction]),
    )


@dataclasses.dataclass
class Run:
    reward_first: float  # mean reward of the first 5 steps
    reward_last: float  # of the last 5
    reward_mean: float  # over every step (how fast it rose)
    logp_abs_mean: float  # drift/logp_abs_mean, averaged over the steps
    logp_abs_max: float  # drift/logp_abs_max, the largest over the steps
    clip_frac: float  # replay/clip_frac, averaged over the steps


def run(replay: str, weights_dtype: str | None, seed: int, steps: int) -> Run:
    grpo = learner(replay, weights_dtype, seed)
    history = [grpo.train_step() for _ in range(steps)]
    reward = [m["rewards/total/mean"] for m in history]
    return Run(float(np.mean(reward[:5])), float(np.mean(reward[-5:])), float(np.mean(reward)),
               float(np.mean([m["drift/logp_abs_mean"] for m in history])),
               float(np.max([m["drift/logp_abs_max"] for m in history])),
               float(np.mean([m["replay/clip_frac"] for m in history])))


def interval(values: list[float]) -> str:
    """mean ± the 95% t-interval's half-width over the seeds."""
    x = np.asarray(values)
    half = T_95.get(len(x), 2.0) * x.std(ddof=1) / np.sqrt(len(x)) if len(x) > 1 else 0.0
    return f"{x.mean():.4g} ± {half:.2g}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    args = parser.parse_args()
    table = {}
    for name, (replay, dtype) in CONFIGS.items():
        runs = []
        for seed in args.seeds:
            start = time.perf_counter()
            r = run(replay, dtype, seed, args.steps)
            runs.append(r)
            print(f"{name:28s} seed {seed}: reward {r.reward_first:.3f} -> {r.reward_last:.3f} (mean {r.reward_mean:.3f}), "
                  f"mean |dlogp| "
                  f"{r.logp_abs_mean:.2e}, max {r.logp_abs_max:.2e}, clipped {r.clip_frac:.4f} "
                  f"({time.perf_counter() - start:.0f} s)", flush=True)
        table[name] = runs
    print(f"\n| rollout | reward gain ({args.steps} steps) | mean reward over the steps | mean abs gap | largest | "
          "share outside [0.8, 1.2] |\n|---|---|---|---|---|---|")
    for name, runs in table.items():
        print(f"| {name} | {interval([r.reward_last - r.reward_first for r in runs])} | "
              f"{interval([r.reward_mean for r in runs])} | {interval([r.logp_abs_mean for r in runs])} | "
              f"{max(r.logp_abs_max for r in runs):.3g} | {interval([r.clip_frac for r in runs])} |")


if __name__ == "__main__":
    main()
