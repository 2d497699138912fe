"""`trainer eval --run DIR`: held-out greedy accuracy and unbiased pass@k of a run's latest checkpoint.

The run folder is only read (see `trainer.run.policy`); one at a URL, from a local copy.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rl_core.run import storage
from rl_core.config import ConfigError

from trainer import build
from trainer.evaluate.heldout import evaluate
from trainer.run.folder import settings_of_run
from trainer.run.policy import load_run_policy
from trainer.run.train import readable_run


def evaluate_run(run_dir: str | Path, *, k: int | None = None, samples: int | None = None, seed: int = 0) -> dict[str, Any]:
    """Evaluate the latest checkpoint of `run_dir` on the run's held-out split.

    k and samples default to the run's `eval.pass_k` and `eval.samples_per_prompt`;
    with both defaults (and seed 0) the numbers equal the run's own final evaluation.
    """
    if storage.is_url(run_dir):
        with readable_run(run_dir) as local:
            return evaluate_run(local, k=k, samples=samples, seed=seed) | {"run": run_dir}
    run_dir = Path(run_dir)
    settings = settings_of_run(run_dir)
    k = settings.eval.pass_k if k is None else k
    samples = settings.eval.samples_per_prompt if samples is None else samples
    if k < 1:
        raise ConfigError(f"--k = {k}: must be >= 1")
    if samples < k:
        raise ConfigError(f"--samples = {samples}: must be >= k ({k}) for the unbiased pass@k estimate")
    run = load_run_policy(run_dir)
    prompts = build.heldout(run.task, settings)
    metrics = evaluate(
        run.learner.sampler,
        run.policy_params,
        run.tokenizer,
        run.task,
        prompts,
        pass_k=k,
        samples_per_prompt=samples,
        temperature=settings.rollout.temperature or 1.0,
        seed=seed,
        rollout=settings.rollout,
    )
    return {
        "run": str(run_dir),
        "algo": settings.algo,
        "step": run.step,
        "heldout_size": len(prompts),
        "samples_per_prompt": samples,
        "k": k,
        **metrics,
    }
