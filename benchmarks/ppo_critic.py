"""PPO's critic on held-out rollouts, by step: the curve behind docs/ppo.md.

    uv run python benchmarks/ppo_critic.py [--steps 200] [--at 25,50,100,200] [--base-cache DIR] [key=value ...]

The arithmetic task from the default warm start, one completion per prompt, 256 prompts a
step (GRPO's rollout budget), four mini-batches of 64, PPO's defaults otherwise, at the
trainer's learning rate (1e-3); `key=value` settings go on top (e.g.
training.learning_rate=5e-4 --steps 150 eval.heldout_size=500 for the run
tests/trainer/test_trainer_learning_ppo.py makes, algorithm.critic_warmup_steps=50, or
model.critic_confidence=false for the scalar head alone). At each step of --at:

  accuracy   greedy held-out accuracy on 200 problems (eval/accuracy)
  critic EV  the critic's explained variance of the Monte Carlo return on held-out rollouts
             (eval/critic_explained_variance: one sampled completion per problem, every
             completion token, sampled with the evaluation's own key)
  ceiling    on the very same rollouts, the explained variance of the values a critic that
             knew the task would give: the mean return of the rollouts whose token shares the
             position, whether the digits written so far begin the right sum, and the problem's
             carries (fitted on those rollouts, so a little optimistic)
  left       by completion token t, the share of the return's variance (over all tokens) that
             each critic leaves unexplained at t: sum_t (G - V)^2 / sum (G - mean G)^2 (a row
             sums to 1 - EV when the values are right on average; a bias adds its square)

The gap between the critic and the ceiling is what the critic has not learned: whether the
digits it reads are the right ones. --base-cache keeps the warm-started base policy (800
supervised steps, about a minute) for later runs. Prints one JSON line per evaluation.
"""

import argparse
import json
import tempfile
from collections import defaultdict
from pathlib import Path

import jax
import numpy as np
from algo_ppo.learner import HELDOUT_SEED
from rl_core import explained_variance
from trainer import build
from trainer.run import load_task, policy_evaluation
from trainer.settings import build_settings

RUN = ["training.prompts_per_step=256", "training.mini_batch_size=64", "training.checkpoint_every_steps=0",
       "eval.every_steps=0", "eval.heldout_size=200", "eval.samples_per_prompt=1", "eval.pass_k=1"]


def knowing_critic(prompts: list[str], texts: list[str], rewards: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """[B, T] values of a critic that knows the task (module docstring): mean returns by
    (position, right so far, carries)."""
    keys = np.full(mask.shape, None, object)
    for i, (prompt, text) in enumerate(zip(prompts, texts, strict=True)):
        a, b = map(int, prompt[:-1].split("+"))
        carries = ((a % 10 + b % 10) >= 10, (a // 10 + b // 10 + ((a % 10 + b % 10) >= 10)) >= 10)
        for t in range(int(mask[i].sum())):  # the value before token t has read text[:t]
            keys[i, t] = (t, str(a + b).startswith(text[:t]), carries)
    returns = defaultdict(list)
    for i, t in zip(*np.nonzero(mask)):
        returns[keys[i, t]].append(rewards[i])
    values = np.zeros(mask.shape, np.float32)
    for i, t in zip(*np.nonzero(mask)):
        values[i, t] = np.mean(returns[keys[i, t]])
    return values


def heldout(learner, prompts) -> dict[str, float]:
    """The critic's fit (the learner's own metric) and the ceiling on the same rollouts."""
    critic = learner.heldout_metrics(prompts)["eval/critic_explained_variance"]
    key = jax.random.fold_in(jax.random.PRNGKey(HELDOUT_SEED), learner.step)  # the rollouts it used
    groups, example = learner.heldout_rollouts(prompts, key)
    mask = groups.completion_mask
    returns = groups.rewards[:, None] * mask  # gamma = 1: the sequence reward at every token
    values = knowing_critic([p.text for p in groups.prompts], list(groups.texts), groups.rewards, mask)
    ceiling = float(explained_variance(values, returns, mask))
    ours = learner.critic_values(example)
    return {"critic_ev": round(float(critic), 3), "ceiling_ev": round(ceiling, 3),
            "sampled_accuracy": round(float(groups.rewards.mean()), 3),
            "left_critic": left_by_position(ours, returns, mask),
            "left_ceiling": left_by_position(values, returns, mask)}


def left_by_position(values: np.ndarray, returns: np.ndarray, mask: np.ndarray) -> list[float]:
    """The module docstring's `left`: unexplained squared error at each completion token, over the total variance."""
    real = mask > 0
    total = np.sum(np.square(returns - returns[real].mean())[real])
    error = np.where(real, np.square(returns - values), 0.0).sum(axis=0) / max(total, 1e-12)
    return [round(float(x), 3) for x in error[: int(real.any(axis=0).sum())]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--at", default="25,50,100,200", help="steps to evaluate at (comma-separated)")
    parser.add_argument("--base-cache", type=Path, default=None, help="folder for the warm-started base policy")
    parser.add_argument("overrides", nargs="*", metavar="key=value")
    args = parser.parse_args()
    at = sorted({int(x) for x in args.at.split(",")})
    settings = build_settings(algo="ppo", overrides=[*RUN, f"training.num_steps={args.steps}", *args.overrides])
    if settings.task.name != "arithmetic":
        parser.error("the ceiling reads arithmetic problems (task.name=arithmetic)")
    tokenizer = build.tokenizer(settings)
    task = load_task(settings, tokenizer, lambda _: None)
    cache = args.base_cache or Path(tempfile.mkdtemp())
    policy = build.base_policy(settings, task, tokenizer, build.new_model(settings, tokenizer), cache, print)
    learner = build.learner(settings, task, tokenizer, build.adapted(settings, policy), output_dir=None,
                            progress=False)
    prompts = build.heldout(task, settings)
    rows = [{"step": 0, "accuracy": policy_evaluation(learner, task, settings)["eval/accuracy"]}]
    print(json.dumps(rows[0]), flush=True)
    while learner.step < args.steps:
        learner.train_step()
        if learner.step in at:
            row = {"step": learner.step, "accuracy": policy_evaluation(learner, task, settings)["eval/accuracy"],
                   **heldout(learner, prompts)}
            rows.append(row)
            print(json.dumps(row), flush=True)
    print("| step | " + " | ".join(str(r["step"]) for r in rows) + " |")
    for name in ("accuracy", "critic_ev", "ceiling_ev"):
        print(f"| {name} | " + " | ".join(f"{r[name]:.3f}" if name in r else "-" for r in rows) + " |")


if __name__ == "__main__":
    main()
