"""One run of a learning test, in a process of its own.

    python learning_run.py [--shuffled-rewards] ALGO RUN_DIR BASE_CACHE [KEY=VALUE ...]

trains ALGO with the settings given (the base policy cached in BASE_CACHE) and
prints one JSON line: the held-out accuracy before and after, and every metric of
the final evaluation. The learning tests
run here with XLA's own settings, as `trainer` runs, not with the suite's
compile-time flags (optimization level 0, older fusion emitters): these programs
run for hundreds of steps, in a third less time with XLA's defaults.

`--shuffled-rewards` is the control run: each step's rewards are permuted over its
completions before the advantages are computed (the same rewards, on the wrong
completions), so an update carries no information about which answers are right.
The held-out evaluation scores with the task's reward functions directly, unshuffled.
"""

import dataclasses
import json
import sys
from pathlib import Path

import numpy as np

from rl_core.learner.pipeline import PolicyGradientLearner
from trainer.run import train_run
from trainer.run.teacher import load_teacher
from trainer.settings import build_settings


def shuffle_training_rewards(seed: int) -> None:
    """Every pipeline learner of this process (GRPO's family and PPO) scores, then permutes the
    scores of the batch."""
    rng = np.random.default_rng(seed)
    score = PolicyGradientLearner._score

    def shuffled(self, groups, draw=None):
        groups = score(self, groups, draw)
        order = rng.permutation(len(groups.rewards))
        return dataclasses.replace(groups, rewards=groups.rewards[order],
                                   reward_scores={k: v[order] for k, v in groups.reward_scores.items()})

    PolicyGradientLearner._score = shuffled


def main() -> None:
    args = sys.argv[1:]
    if args[0] == "--shuffled-rewards":
        args = args[1:]
        shuffle_training_rewards(seed=0)
    algo, run_dir, base_cache, *overrides = args
    settings = build_settings(algo=algo, overrides=overrides)
    summary = train_run(settings, Path(run_dir), progress=False, log=lambda _: None, base_cache=Path(base_cache),
                        teacher=load_teacher)  # a distilling run's (algorithm.teacher)
    print(json.dumps({"before": summary["before"]["eval/accuracy"], "after": summary["after"]["eval/accuracy"],
                      "after_metrics": summary["after"]}))


if __name__ == "__main__":
    main()
