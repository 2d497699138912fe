"""`trainer eval --run DIR`: held-out greedy accuracy and unbiased pass@k of a run's latest checkpoint.

The run folder is only read (see `trainer.run.policy`); one at a URL, from a local copy.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rl_core.run import storage
from rl_core import ConfigError

from trainer import build
from trainer.evaluate.benchmark import benchmark
from trainer.evaluate.heldout import evaluate
from trainer.run.folder import settings_of_run
from trainer.run.policy import load_run_policy
from trainer.run.train import load_task, readable_run
from trainer.settings import build_settings
from trainer.tasks.data_task import EVAL_TASK_OPTIONS, evaluation_set


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
        run.learner.generator.sampler,
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


def evaluate_data(
    data: str,
    *,
    run_dir: str | Path | None = None,
    model_dir: str | None = None,
    k: int = 4,
    samples: int = 8,
    reward: str | None = None,
    seed: int = 0,
    overrides: Sequence[str] = (),
) -> dict[str, Any]:
    """Accuracy, pass@k and maj@k with intervals (overall and per data_source) of the rows of `data`,
    answered by a run's latest checkpoint (`run_dir`) or by a model folder (`model_dir`), scored by
    `reward` (default: the run's data-task reward, else one chosen from the rows' references)."""
    if (run_dir is None) == (model_dir is None):
        raise ConfigError("trainer eval --data needs either --run DIR or --model DIR")
    if samples < k or k < 1:
        raise ConfigError(f"--k = {k} and --samples = {samples}: need 1 <= k <= samples")
    if run_dir is not None:
        run = load_run_policy(run_dir)
        settings, tokenizer, sampler, params, step = run.settings, run.tokenizer, run.learner.generator.sampler, run.policy_params, run.step
    else:
        settings = build_settings(algo="grpo", overrides=[f"model.path={model_dir}", f"task.options.data={data}",
                                                          "warm_start.steps=0", *([f"task.options.reward={reward}"] if reward else []),
                                                          *overrides])
        tokenizer = build.tokenizer(settings)
        task = load_task(settings, tokenizer, log=lambda _: None)
        learner = build.learner(settings, task, tokenizer, build.new_model(settings, tokenizer), output_dir=None, progress=False)
        sampler, params, step = learner.generator.sampler, learner.policy_params(), 0
    inherited = {k_: v for k_, v in settings.task.options.items() if k_ in EVAL_TASK_OPTIONS} if settings.task.name == "data" else {}
    if reward is not None:
        inherited["reward"] = reward
    task = build.chat_prompts(evaluation_set(data, max_prompt_tokens=settings.rollout.max_prompt_tokens,
                                             max_new_tokens=settings.rollout.max_new_tokens, **inherited), tokenizer)
    result = benchmark(sampler, params, tokenizer, task, task.heldout, k=k, samples=samples,
                       temperature=settings.rollout.temperature or 1.0, seed=seed)
    where = {"run": str(run_dir)} if run_dir is not None else {"model": str(model_dir)}
    return {**where, "data": str(data), "step": step, **result}


def results_path(run_dir: Path, data: str) -> Path:
    """Where `trainer eval --data` writes its results beside a run: eval/<file stem>.json."""
    stem = Path(data.split(":")[0]).stem or "data"
    return run_dir / "eval" / f"{stem}.json"
