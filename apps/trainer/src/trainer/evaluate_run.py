"""`trainer eval --run DIR`: held-out greedy accuracy and unbiased pass@k of a run's latest checkpoint.

The run folder's `config.yaml` rebuilds the task, tokenizer and model; the
learner is built only for the shape of its checkpointed state (params,
optimizer state, RNG), which the run's latest checkpoint then fills. The run
folder is only read: no metrics, event files or checkpoints are written.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rl_core.checkpoint import Checkpointer
from rl_core.config import ConfigError

from trainer import build
from trainer.evaluate import evaluate
from trainer.run import settings_of_run


def evaluate_run(run_dir: str | Path, *, k: int | None = None, samples: int | None = None, seed: int = 0) -> dict[str, Any]:
    """Evaluate the latest checkpoint of `run_dir` on the run's held-out split.

    k and samples default to the run's `eval.pass_k` and `eval.samples_per_prompt`;
    with both defaults (and seed 0) the numbers equal the run's own final evaluation.
    """
    run_dir = Path(run_dir)
    settings = settings_of_run(run_dir)
    k = settings.eval.pass_k if k is None else k
    samples = settings.eval.samples_per_prompt if samples is None else samples
    if k < 1:
        raise ConfigError(f"--k = {k}: must be >= 1")
    if samples < k:
        raise ConfigError(f"--samples = {samples}: must be >= k ({k}) for the unbiased pass@k estimate")
    checkpoints = run_dir / "checkpoints"
    if not checkpoints.is_dir():
        raise FileNotFoundError(f"{run_dir} has no checkpoints/ folder: was the run trained with `trainer train`?")

    tokenizer = build.tokenizer(settings)
    task = build.chat_prompts(settings.task.build(), tokenizer)
    # Fresh weights only give the structure; the checkpoint replaces them. output_dir=None keeps
    # the learner from opening a metrics file, an event file or a checkpoint manager in the run.
    learner = build.learner(
        settings, task, tokenizer, build.new_model(settings, tokenizer), output_dir=None, progress=False
    )
    checkpointer = Checkpointer(checkpoints)
    try:
        step = checkpointer.latest_step()
        if step is None:
            raise FileNotFoundError(f"{checkpoints} holds no checkpoint")
        like = {"params": learner.params, "opt_state": learner.opt_state, "rng": learner.rng}
        arrays, _ = checkpointer.restore(step, like=like)
    finally:
        checkpointer.close()
    prompts = build.heldout(task, settings)
    metrics = evaluate(
        learner.sampler,
        arrays["params"],
        tokenizer,
        task,
        prompts,
        pass_k=k,
        samples_per_prompt=samples,
        temperature=settings.rollout.temperature or 1.0,
        seed=seed,
    )
    return {
        "run": str(run_dir),
        "algo": settings.algo,
        "step": step,
        "heldout_size": len(prompts),
        "samples_per_prompt": samples,
        "k": k,
        **metrics,
    }
