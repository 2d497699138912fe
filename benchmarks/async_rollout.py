"""Step time with synchronous rollouts and async rollouts k = 1, 2, 4 steps ahead, with a slow reward.

    uv run python benchmarks/async_rollout.py [--delay 0.2] [--steps 8] [--prompts 8] [--group 8]
        [--staleness 1 2 4] [--rounds 1] [--whole 2 4]

GRPO on the tiny-qwen2 shape (D=128, 4 layers, random weights, character vocabulary)
and the built-in arithmetic task's prompts; the reward sleeps `--delay` seconds per batch, as a
code sandbox, a judge model or a remote verifier would. Each mode (sync, then async with
`training.max_staleness` = each of `--staleness`) runs k + 1 untimed steps (compiles; async
mode's first step also collects its first k batches) and then `--steps` timed ones, in
`--rounds` rounds that alternate the modes (a busy machine drifts); printed per mode: the
median over the rounds of each round's mean seconds per step and of its phases
(rollout = generation and decoding, reward = scoring, logprob = the log-prob
passes, update = the optimizer steps), and for async the waits of each side
(wait_scoring: the step waiting for its own batch's scoring to end).

A batch is generated while one update runs; its scoring then runs on one of k scoring threads
while the next batches generate and train, until the step that trains it (rl_core.rollout.
async_rollout): each batch has k steps to be scored, so the async step is bounded by
max(rollout, logprob + update, reward / k) of the synchronous phases. `--whole` adds modes whose
collection is waited for whole within the step that started it, as before that cut: bounded
by max(rollout + reward, logprob + update) at any k. On a CPU the rollout thread and the
update also share the cores.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import rewards
from algo_grpo import GRPOConfig, GRPOLearner
from flax import nnx
from rl_core import RolloutConfig, TrainingConfig
from rl_core.rollout import Collection
from rl_core.runtime import keep_freed_memory, unroll_threefry_on_cpu
from rl_models import CharTokenizer, Transformer, TransformerConfig
from trainer.tasks import arithmetic


def slow_reward(delay: float):
    answer = rewards.numeric_answer_reward()

    def numeric_answer(prompts, completions, **fields):
        time.sleep(delay)  # once per batch: the reward manager calls a function with the whole batch
        return answer(prompts, completions, **fields)

    return numeric_answer


class WholeCollection(GRPOLearner):
    """GRPO with its collection never cut: scored on the rollout thread and waited for within
    the step that started it, at any k (how every collection ran before the cut)."""

    def _collection(self) -> Collection:
        return Collection(self._collect)


def run(mode: int | str, args: argparse.Namespace) -> dict[str, float]:
    """Mean seconds of the timed steps at staleness `mode` (0: synchronous rollouts; "whole k":
    k with the collection waited for whole)."""
    whole = isinstance(mode, str)
    k = int(str(mode).removeprefix("whole "))
    tok = CharTokenizer()
    config = TransformerConfig.tiny_qwen2(tok.vocab_size)
    learner = (WholeCollection if whole else GRPOLearner)(
        GRPOConfig(group_size=args.group, beta=0.0, tis_cap=2.0),
        policy=Transformer(config, rngs=nnx.Rngs(0)),
        tokenizer=tok,
        train_data=list(arithmetic().train),
        training=TrainingConfig(prompts_per_step=args.prompts, learning_rate=1e-4, num_steps=args.steps + k + 1,
                                async_rollout="one_step" if k else "off", max_staleness=max(k, 1)),
        rollout=RolloutConfig(max_new_tokens=args.new_tokens, max_prompt_tokens=16, temperature=1.0),
        reward_manager=rewards.RewardManager([slow_reward(args.delay)]),
    )
    for _ in range(k + 1):  # compiles; async: the first step collects k batches in line
        learner.train_step()
    rows = [learner.train_step() for _ in range(args.steps)]
    learner.close()
    keys = ["time/step", "time/rollout", "time/reward", "time/logprob", "time/update", "time/wait_rollout",
            "time/wait_update", "time/wait_scoring"]
    return {k: float(np.mean([r[k] for r in rows])) for k in keys if k in rows[0]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--delay", type=float, default=0.2, help="seconds the reward sleeps per batch")
    p.add_argument("--steps", type=int, default=8, help="timed steps per mode")
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--staleness", type=int, nargs="+", default=[1, 2, 4], help="async modes' max_staleness")
    p.add_argument("--rounds", type=int, default=1, help="rounds over the modes, alternating")
    p.add_argument("--whole", type=int, nargs="*", default=[],
                   help="also these max_staleness with each collection waited for whole (no scoring apart)")
    args = p.parse_args()
    keep_freed_memory()
    unroll_threefry_on_cpu()
    modes = [0, *args.staleness, *(f"whole {k}" for k in args.whole)]
    rounds = [{k: run(k, args) for k in modes} for _ in range(args.rounds)]
    rows = {k: {name: float(np.median([r[k][name] for r in rounds])) for name in rounds[0][k]} for k in modes}
    for k, row in rows.items():
        name = "sync" if k == 0 else f"async k={k}"
        name = name.replace("k=whole ", "whole k=")
        print(f"{name:11s} " + "  ".join(f"{n.removeprefix('time/')} {v:.3f} s" for n, v in row.items()))
    sync = rows[0]
    # scored apart, a batch's scoring overlaps the next generations and k - 1 other scorings;
    # whole, it follows its own generation within one update
    for k in modes[1:]:
        step = rows[k]["time/step"]
        bound = max(sync["time/logprob"] + sync["time/update"],
                    max(sync["time/rollout"], sync["time/reward"] / k) if isinstance(k, int) else
                    sync["time/rollout"] + sync["time/reward"])
        ratios = [r[k]["time/step"] / r[0]["time/step"] for r in rounds]  # within a round: alike load
        print(f"k={k}: async step / sync step {step / sync['time/step']:.2f} (median of the rounds' ratios "
              f"{float(np.median(ratios)):.2f}); / the bound from the sync phases {step / bound:.2f}")
    if args.rounds > 1:
        for k in modes:
            print(f"{'sync' if k == 0 else f'k={k}'} step per round: "
                  + " ".join(f"{r[k]['time/step']:.3f}" for r in rounds))


if __name__ == "__main__":
    main()
