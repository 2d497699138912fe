"""Partial rollouts: async step time and the tokens each weight version sampled, off / continue / recompute.

    uv run python benchmarks/partial_rollouts.py [--steps 6] [--prompts 8] [--group 8] [--new-tokens 64]
        [--slots 16] [--delay 0.0] [--rounds 2]

GRPO on the tiny-qwen2 shape (D=128, 4 layers, random weights, character vocabulary) and the
built-in arithmetic task's prompts, async rollouts one step ahead on the paged engine, with
`rollout.partial_rollouts` off, continue and recompute. Each mode runs 2 untimed steps (compiles;
the first step collects its batch in line) and then `--steps` timed ones, in `--rounds` rounds
that alternate the modes (a busy machine drifts). Printed per mode: mean seconds per step and of
its phases, the weight switches a collection took, and the fraction of the trained tokens
sampled by the weights that train on them (`rollout/staleness_current_frac`: those sampled after
the update beside their collection published its weights; 0 when off).

`--slots` decode slots (16 for 64 completions: four waves) make the generation outlast the
update, as it does where generation dominates a step; a collection that is done before the
update ends takes no new weights, and partial rollouts change nothing.

Where a switch falls depends on when the update ends against the collection's progress, so the
fractions move with the machine's load.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import rewards
from algo_grpo import GRPOConfig, GRPOLearner
from flax import nnx
from rl_core import RolloutConfig, TrainingConfig
from rl_core.runtime import keep_freed_memory, unroll_threefry_on_cpu
from rl_models import PAGED_TRANSFORMER, CharTokenizer, Transformer, TransformerConfig
from trainer.tasks import arithmetic

MODES = ("off", "continue", "recompute")


def slow_reward(delay: float):
    answer = rewards.numeric_answer_reward()

    def numeric_answer(prompts, completions, **fields):
        time.sleep(delay)  # once per batch
        return answer(prompts, completions, **fields)

    return numeric_answer


def run(mode: str, args: argparse.Namespace) -> dict[str, float]:
    """Means over the timed steps with `rollout.partial_rollouts = mode`."""
    tok = CharTokenizer()
    learner = GRPOLearner(
        GRPOConfig(group_size=args.group, beta=0.0),
        policy=Transformer(TransformerConfig.tiny_qwen2(tok.vocab_size), rngs=nnx.Rngs(0)),
        paging=PAGED_TRANSFORMER,
        tokenizer=tok,
        train_data=list(arithmetic().train),
        training=TrainingConfig(prompts_per_step=args.prompts, learning_rate=1e-4, num_steps=args.steps + 2,
                                async_rollout="one_step"),
        rollout=RolloutConfig(max_new_tokens=args.new_tokens, max_prompt_tokens=16, temperature=1.0, engine="paged",
                              options={"slots": args.slots}, partial_rollouts=mode),
        reward_manager=rewards.RewardManager([slow_reward(args.delay)]),
    )
    for _ in range(2):
        learner.train_step()
    before = getattr(learner.generator.backend, "switches", 0)
    rows = [learner.train_step() for _ in range(args.steps)]
    switches = getattr(learner.generator.backend, "switches", 0) - before
    learner.close()
    keys = ["time/step", "time/rollout", "time/reward", "time/logprob", "time/update", "time/wait_rollout",
            "rollout/staleness_current_frac", "rollout/staleness_token_lag_mean"]
    out = {k: float(np.mean([r[k] for r in rows])) for k in keys if k in rows[0]}
    out["switches per step"] = switches / args.steps
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=6, help="timed steps per mode")
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--slots", type=int, default=16, help="the engine's decode slots")
    p.add_argument("--delay", type=float, default=0.0, help="seconds the reward sleeps per batch")
    p.add_argument("--rounds", type=int, default=2, help="rounds over the modes, alternating")
    args = p.parse_args()
    keep_freed_memory()
    unroll_threefry_on_cpu()
    rounds = [{mode: run(mode, args) for mode in MODES} for _ in range(args.rounds)]
    for mode in MODES:
        row = {name: float(np.mean([r[mode][name] for r in rounds])) for name in rounds[0][mode]}
        print(f"{mode:9s} " + "  ".join(f"{n.removeprefix('time/')} {v:.3f}" for n, v in row.items()))
    off = [r["off"]["time/step"] for r in rounds]
    for mode in MODES[1:]:
        ratios = [r[mode]["time/step"] / s for r, s in zip(rounds, off, strict=True)]
        print(f"{mode}: step / off step per round " + " ".join(f"{x:.2f}" for x in ratios))


if __name__ == "__main__":
    main()
