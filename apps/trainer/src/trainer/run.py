"""`trainer train`: one run in a run folder, resumable, stoppable with Ctrl-C."""

from __future__ import annotations

import hashlib
import json
import shutil
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from trainer import build
from trainer.evaluate import evaluate
from trainer.settings import RunSettings, build_settings


def final_evaluation(learner, task, settings: RunSettings, seed: int = 0) -> dict[str, float]:
    """Greedy accuracy, pass@k and lengths on the held-out set."""
    return evaluate(
        learner.sampler,
        learner.params,
        learner.tokenizer,
        task,
        build.heldout(task, settings),
        pass_k=settings.eval.pass_k,
        samples_per_prompt=settings.eval.samples_per_prompt,
        temperature=settings.rollout.temperature or 1.0,
        seed=seed,
    )


def base_evaluation(learner, task, settings: RunSettings, cache_dir: Path) -> dict[str, float]:
    """The base policy's evaluation, cached beside the base policy.

    Every variant of a comparison starts from the same weights and evaluates
    them the same way, so the evaluation runs once, not once per variant.
    """
    what = {
        "base": build.base_policy_key(settings),
        "eval": settings.eval.to_dict(),
        # the evaluation seeds its own sampling: runs that differ only in rollout.seed share it
        "rollout": {k: v for k, v in settings.rollout.to_dict().items() if k != "seed"},
    }
    key = hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:12]
    path = cache_dir / f"eval-base-{key}.json"
    if path.exists():
        return json.loads(path.read_text())
    metrics = final_evaluation(learner, task, settings)
    path.write_text(json.dumps(metrics, indent=2))
    return metrics


def train_run(
    settings: RunSettings,
    run_dir: Path,
    *,
    resume: bool = False,
    progress: bool = True,
    log: Callable[[str], None] = print,
    base_cache: Path | None = None,
    overwrite: bool = False,
) -> dict[str, Any]:
    """Train one variant in `run_dir`; returns the summary also written to summary.json.

    The base policy is cached in `base_cache` (default: the run folder). A
    folder that already holds a run is continued with `resume`, replaced with
    `overwrite`, and otherwise refused: a finished run is never lost silently.
    """
    if not resume or not any((run_dir / "checkpoints").glob("[0-9]*")):
        # a resume with no checkpoint yet starts over: records past the last checkpoint never count
        _claim(run_dir, overwrite or resume)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(settings.resolved(), sort_keys=False))
    tokenizer = build.tokenizer(settings)
    task = build.chat_prompts(settings.task.build(), tokenizer)
    policy = build.base_policy(settings, task, tokenizer, base_cache or run_dir, log, progress=progress)
    learner = build.learner(settings, task, tokenizer, policy, output_dir=run_dir, progress=progress)
    before_path = run_dir / "eval_before.json"
    if resume and learner.resume():
        log(f"resumed {run_dir} at step {learner.step}")
        before = json.loads(before_path.read_text())
    else:
        before = base_evaluation(learner, task, settings, base_cache or run_dir)
        before_path.write_text(json.dumps(before, indent=2))
    log(f"{settings.algo}: held-out accuracy before RL {before['eval/accuracy']:.3f}")

    previous = signal.signal(signal.SIGINT, lambda *_: _stop(learner, log))
    start = time.perf_counter()
    try:
        history = learner.train()
    finally:
        signal.signal(signal.SIGINT, previous)
        learner.close()
    after = final_evaluation(learner, task, settings)
    summary = {
        "algo": settings.algo,
        "steps": learner.step,
        "before": before,
        "after": after,
        "train_seconds": time.perf_counter() - start,
        "generated_tokens": sum(h.get("perf/generated_tokens", 0.0) for h in history),
        "uniform_frac_mean": _mean(h.get("groups/uniform_frac") for h in history),
        "skipped_updates": learner.skipped_updates,
    }
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    log(f"{settings.algo}: held-out accuracy after RL {after['eval/accuracy']:.3f} ({plural(learner.step, 'step')})")
    return summary


RUN_FILES = ("checkpoints", "tensorboard", "metrics.jsonl", "samples.jsonl", "eval_before.json", "summary.json")


def _claim(run_dir: Path, overwrite: bool) -> None:
    existing = [name for name in RUN_FILES if (run_dir / name).exists()]
    if not existing:
        return
    if not overwrite:
        raise FileExistsError(
            f"{run_dir} already holds a run ({', '.join(existing)}); continue it with "
            f"`trainer train --resume {run_dir}` or choose another --output"
        )
    for name in existing:
        path = run_dir / name
        shutil.rmtree(path) if path.is_dir() else path.unlink()


def _stop(learner, log: Callable[[str], None]) -> None:
    log("interrupt: stopping after the current step, with a checkpoint (Ctrl-C again to abort)")
    signal.signal(signal.SIGINT, signal.default_int_handler)
    learner.request_stop()


def plural(n: int, noun: str) -> str:
    """ "1 step", "2 steps" """
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _mean(values) -> float:
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else 0.0


def settings_of_run(run_dir: Path) -> RunSettings:
    """The resolved settings a run folder was started with."""
    path = run_dir / "config.yaml"
    if not path.exists():
        raise FileNotFoundError(f"{run_dir} is not a run folder: {path.name} is missing")
    return build_settings(config_file=path)
