"""`trainer train`: one run in a run folder, resumable after any crash, stoppable with Ctrl-C or SIGTERM.

Everything that can fail on bad input (settings, data, tokenizer, model files)
is read before the run folder is made, and a start that fails anyway removes
the folder it made. A run folder is never replaced without `overwrite`, and a
user's own config.yaml in it is never written over.

In a multi-process run (see trainer.distributed) every process runs this same
function on the same (shared) run folder and takes the same decisions from
it; process 0 alone writes and removes files and logs, the others keep in step.

A run folder may be a URL (gs://bucket/runs/x, or any fsspec filesystem): the run
works in a local copy pulled from it, and the copy is pushed back after each
checkpoint and when the run ends (see rl_core.run.storage); messages name the URL.

The folder's own files and rules (making room, the settings a run started with, whether it
can resume) are in trainer.run.folder.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from rewards import RewardSpec
from rl_core.runtime import multihost

from rl_core.rollout import explain_engine
from rl_core.run import (
    CHECKPOINTS, CONFIG, EVAL_BEFORE, fault_point, RUN_FILES, saved_steps, SFT_METRICS, storage, SUMMARY,
)

from trainer import build, checks
from trainer.bench.memory_check import fit_memory
from trainer.evaluate import evaluate
from trainer.run import devices
from trainer.run import folder as run_folder
from trainer.run import reward_audit
from trainer.run.prompt_lengths import fit_prompts
from trainer.settings import RunSettings
from trainer.settings.reward_functions import reward_specs
from trainer.signals import RunInterrupted, StopOnSignal
from trainer.tasks import sized_lengths, split_for_warm_start, Task


def final_evaluation(learner, task, settings: RunSettings, seed: int = 0) -> dict[str, float]:
    """`policy_evaluation` and the algorithm's own held-out metrics (e.g. PPO's critic)."""
    return policy_evaluation(learner, task, settings, seed) | learner.heldout_metrics(build.heldout(task, settings))


def policy_evaluation(learner, task, settings: RunSettings, seed: int = 0) -> dict[str, float]:
    """Greedy accuracy, pass@k and lengths on the held-out set."""
    return evaluate(
        learner.generator.sampler,
        learner.policy_params(),
        learner.tokenizer,
        task,
        build.heldout(task, settings),
        pass_k=settings.eval.pass_k,
        samples_per_prompt=settings.eval.samples_per_prompt,
        temperature=settings.rollout.temperature or 1.0,
        seed=seed,
        rollout=settings.rollout,
    )


def base_evaluation(learner, task, settings: RunSettings, cache_dir: Path) -> dict[str, float]:
    """The base policy's evaluation, cached beside the base policy.

    Every variant of a comparison starts from the same weights and evaluates
    them the same way, so the evaluation runs once, not once per variant.
    """
    what = {
        "base": build.base_policy_key(settings),
        "quantize": settings.model.quantize,  # a quantized base answers differently
        "eval": settings.eval.to_dict(),
        # the evaluation seeds its own sampling: runs that differ only in rollout.seed share it
        "rollout": {k: v for k, v in settings.rollout.to_dict().items() if k != "seed"},
    }
    key = hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:12]
    path = cache_dir / f"eval-base-{key}.json"
    multihost.sync("trainer.base_evaluation")  # every process sees the cache as it is now, before process 0 writes it
    if path.exists():
        return json.loads(path.read_text())
    metrics = policy_evaluation(learner, task, settings)  # the policy's alone: every algorithm shares it
    run_folder.write_text(path, json.dumps(metrics, indent=2))
    return metrics


def load_task(settings: RunSettings, tokenizer, log: Callable[[str], None]) -> Task:
    """The task's prompts, chat-templated and cut to those that fit rollout.max_prompt_tokens."""
    task = build.chat_prompts(settings.task.build(), tokenizer)
    specs = reward_specs(settings.rewards) if not task.rewards else ()  # less the judge models, loaded apart
    if specs:  # a data task scored by the run's rewards: alone; the first entry says what is correct
        task = dataclasses.replace(task, rewards=specs, correct=specs[0].name)
    sized = sized_lengths(task, settings.model.path)
    if sized:
        log(f"task {task.name}: lengths from the rows (the character tokenizer's tokens are their characters): "
            + ", ".join(f"{key} {value} (rollout.{key}={getattr(settings.rollout, key)})" for key, value in sized.items())
            + "; task.options.<length>=N sets one")
    if "max_new_tokens" in sized:  # the warm start's targets are as wide as the run's completions
        task = dataclasses.replace(task, max_new_tokens=settings.rollout.max_new_tokens)
    task = fit_prompts(
        task,
        tokenizer,
        max_prompt_tokens=settings.rollout.max_prompt_tokens,
        on_long=settings.task.long_prompts,
        log=log,
    )
    share = build.warm_start_share(settings, task)
    task = split_for_warm_start(task, share)
    if task.warm_start_rows:
        log(f"task {task.name}: the warm start imitates {len(task.warm_start_rows)} training rows, kept apart from "
            f"RL's {len(task.train)} prompts (warm_start.share={share:g}; 1 gives both every row)")
    return task


def train_run(
    settings: RunSettings,
    run_dir: Path | str | storage.StagedFolder,
    *,
    resume: bool = False,
    progress: bool = True,
    log: Callable[[str], None] = print,
    base_cache: Path | None = None,
    overwrite: bool = False,
    reuse_base_from: Sequence[Path] = (),
    rewards: Callable[[Task, Path], Sequence[RewardSpec]] | None = None,
    teacher: Callable[[RunSettings, Any], Any] | None = None,
) -> dict[str, Any]:
    """Train one variant in `run_dir`; returns the summary also written to summary.json.

    `rewards(task, cache_dir)` gives reward functions to add to the task's (trainer.judge.judge_rewards:
    the judge model, loaded once the task is).

    The base policy is cached in `base_cache` (default: the run folder), copied from
    one of `reuse_base_from` when an identical one is cached there. A
    folder that already holds a run is continued with `resume`, replaced with
    `overwrite`, and otherwise refused: a finished run is never lost silently.
    A resumed run that is already finished does nothing; one whose
    `training.num_steps` was raised continues to the new total. Raises
    RunInterrupted when a signal stopped training early. `run_dir` may be a URL.
    """
    if storage.is_url(run_dir):
        return _train_at_url(
            settings, run_dir, resume=resume, progress=progress, log=log, base_cache=base_cache,
            overwrite=overwrite, reuse_base_from=reuse_base_from, rewards=rewards, teacher=teacher,
        )
    mirror = run_dir if isinstance(run_dir, storage.StagedFolder) else None
    run_dir = Path(run_dir)  # a StagedFolder: its local copy
    if not multihost.is_primary():
        log = _quiet  # process 0 speaks for the run
    run_folder.check_can_make(run_dir)
    # model.remat and training.micro_batch_size at "auto": picked to fit this device, written into config.yaml
    # below (a resume reads them back, so it keeps them); a user's own values are only checked
    memory: list[str] = []  # said after the run's first lines (devices, folder)
    settings = fit_memory(settings, log=memory.append)
    if run_dir.exists() and not run_dir.is_dir():
        raise FileExistsError(f"output {run_dir} is a file, not a folder; choose a folder for the run")
    if resume:
        run_folder.refuse_changed_settings(run_dir, settings)
        run_folder.refuse_shortening(run_dir, settings)  # before "finished": 1 of 2 steps is not "nothing to do"
        finished = run_folder.finished_summary(run_dir, settings)
        if finished is not None:
            log(
                f"{run_dir} is finished ({finished['steps']} of {settings.training.num_steps} steps); nothing to do. "
                f"Extend it with `trainer train --resume {run_dir} training.num_steps=<more>`"
            )
            return finished
        if not run_folder.check_resumable(run_dir, settings):
            # killed before its first checkpoint: records past it never count; the warm start's own records
            # continue with its own checkpoint (trainer.warmstart drops those past it)
            run_folder.claim(run_dir, overwrite=True, keep=(SFT_METRICS,))
    else:
        run_folder.claim(run_dir, overwrite)

    log(f"{settings.name}: {devices.describe()}")
    log(f"{settings.name}: run folder {run_dir}")  # without --output its name is made here: say where it went
    for line in memory:
        log(f"{settings.name}: {line}")
    # everything that reads user files, before the run folder exists
    tokenizer = build.tokenizer(settings)
    task = load_task(settings, tokenizer, log)
    model = build.new_model(settings, tokenizer)
    checks.check_finite(settings, model)
    checks.check_critic(settings, model)
    extra = tuple(rewards(task, Path(base_cache or run_dir))) if rewards is not None else ()
    # `teacher(settings, tokenizer)`: a distilling run's teacher (trainer.run.teacher.load_teacher), checked
    # against the student's tokenizer before the run folder exists; None for a run that does not distill
    teacher_model = teacher(settings, tokenizer) if teacher is not None else None

    there = set(os.listdir(run_dir)) if run_dir.exists() else None
    run_dir.mkdir(parents=True, exist_ok=True)
    try:
        run_folder.write_config(run_dir, settings)
        policy = build.base_policy(
            settings, task, tokenizer, model, base_cache or run_dir, log, progress=progress, reuse_from=reuse_base_from,
            metrics_path=run_dir / SFT_METRICS,
        )
        policy = build.adapted(settings, policy)
        if settings.rollout.options.get("local_servers"):  # rollout.engine=remote: this host's servers, stopped at exit
            from trainer.remote import local

            local.launch_for(settings, log)
        learner = build.learner(settings, task, tokenizer, policy, output_dir=mirror or run_dir, progress=progress,
                                rewards=extra, reward_audit=reward_audit.auditor(settings, task, log),
                                teacher=teacher_model)
    except Exception:
        if multihost.is_primary():
            run_folder.remove_new(run_dir, there)  # a failed start leaves no half-made run folder
        raise
    # The learner trains float32 copies and keeps the loaded weights only as the reference
    # (beta > 0) or the frozen base (LoRA): with beta = 0 this frees the whole loaded model.
    del model, policy
    log(f"{settings.name}: rollout engine {explain_engine(settings.rollout)}")  # as settings_at_start.json records it
    probed = reward_audit.probe(learner.reward_manager, task, settings, tokenizer, log)  # once, before any step

    with StopOnSignal(log) as signals:
        before_path = run_dir / EVAL_BEFORE
        if resume and learner.resume(log):
            log(f"resumed {run_dir} at step {learner.step}")
            before = json.loads(before_path.read_text())
        else:
            if resume and saved_steps(run_dir / CHECKPOINTS) == []:
                run_folder.refuse_if_checkpoints_lost(run_dir)
            before = base_evaluation(learner, task, settings, base_cache or run_dir)
            run_folder.write_text(before_path, json.dumps(before, indent=2))
        log(f"{settings.name}: held-out accuracy before RL {before['eval/accuracy']:.3f}")

        start = time.perf_counter()
        signals.stop_gracefully(learner)
        try:
            history = learner.train()
        except BaseException as e:
            signals.stop_at_once()
            with contextlib.suppress(Exception):  # the error that stopped training is the one to report
                learner.close()
            if isinstance(e, OSError) and e.strerror:  # a full disk, say: what is kept, and how to go on
                raise OSError(e.errno, f"{e.strerror}; {stopped_at(learner.step, run_dir)}", e.filename) from e
            raise
        signals.stop_at_once()
        learner.close()
        summary = {
            "algo": settings.algo,
            "steps": learner.step,
            "before": before,
            "after": None,
            "train_seconds": time.perf_counter() - start,
            "generated_tokens": sum(h.get("perf/generated_tokens", 0.0) for h in history),
            "uniform_frac_mean": _mean(h.get("groups/uniform_frac") for h in history),
            # from the records, not the learner's counter: a resumed run counts the steps before its restart
            "skipped_updates": int(sum(h.get("train/skipped_updates", 0.0) for h in history)),
            "reward_audit": reward_audit.report(history, probed, settings, task, log),  # docs/reward-audits.md
        }
        if signals.received is not None:
            message = (
                f"interrupted at step {learner.step} of {settings.training.num_steps} by {signals.received.name}; "
                f"checkpoint {learner.step} saved; continue with `trainer train --resume {run_dir}`"
            )
            summary["interrupted"] = message
            run_folder.write_text(run_dir / SUMMARY, json.dumps(summary, indent=2))
            raise RunInterrupted(message, 128 + signals.received.value)
        fault_point("final_eval")
        summary["after"] = final_evaluation(learner, task, settings)
        run_folder.write_text(run_dir / SUMMARY, json.dumps(summary, indent=2))
    accuracy = summary["after"]["eval/accuracy"]
    log(f"{settings.name}: held-out accuracy after RL {accuracy:.3f} ({plural(learner.step, 'step')})")
    return summary


STAGED_SAVES = ("checkpoints/*", "base-policy-*.partial/*", "base-policy-" + "?" * 12)
"""Orbax saves in a run folder: the checkpoints, the warm start's, the cached base policy
(`build.base_policy`). At a URL each counts only once complete (rl_core.run.storage)."""


def _train_at_url(settings: RunSettings, url: str, *, resume: bool, overwrite: bool, log: Callable[[str], None],
                  **kwargs: Any) -> dict[str, Any]:
    """`train_run` in a local copy of the run folder at `url`, pushed there after each checkpoint
    (by the learner's recorder) and at the end, however the run ends (a copy that cannot be pushed
    is kept, and named)."""
    folder = storage.StagedFolder(url, committed=STAGED_SAVES)
    try:
        if not resume:  # refused before anything is fetched; replaced runs are not fetched at all
            names = folder.top_level_names()
            existing = [n for n in (*RUN_FILES, CONFIG) if n in names]
            run_folder.refuse_unless_overwrite(url, existing, overwrite)
        folder.pull(skip=() if resume else RUN_FILES)
        summary = train_run(settings, folder, resume=resume, overwrite=overwrite,
                            log=lambda message: log(folder.shown(message)), **kwargs)
        folder.push()
    except BaseException as e:
        _push_what_was_done(folder, log)
        _show_url(e, folder)
        raise
    folder.close()
    return summary


def _push_what_was_done(folder: storage.StagedFolder, log: Callable[[str], None]) -> None:
    """After a failure: push the local copy (an interrupted run's checkpoint and summary), then
    remove it; a copy that cannot be pushed is kept, with its path in `log`."""
    if folder.pulled:
        try:
            folder.push()
        except Exception as e:  # noqa: BLE001 - any storage error: the copy is what is left
            log(f"could not push the run to {folder.url} ({type(e).__name__}: {e}); its local copy is kept in "
                f"{folder.local}")
            return
    folder.close()


def _show_url(error: BaseException, folder: storage.StagedFolder) -> None:
    """`error`'s message about the local copy turned into one about the URL, in place."""
    error.args = tuple(folder.shown(a) if isinstance(a, str) else a for a in error.args)
    if isinstance(error, OSError):
        for attr in ("filename", "filename2"):
            value = getattr(error, attr)
            if isinstance(value, (str, os.PathLike)):
                setattr(error, attr, folder.shown(os.fspath(value)))


@contextlib.contextmanager
def readable_run(run_dir: Path | str) -> Iterator[Path]:
    """The run folder to read: `run_dir` itself, or a local copy of the one at a URL (removed
    afterwards; errors name the URL)."""
    if not storage.is_url(run_dir):
        yield Path(run_dir)
        return
    folder = storage.open_staged(run_dir, committed=STAGED_SAVES)
    try:
        yield folder.local
    except BaseException as e:
        _show_url(e, folder)
        raise
    finally:
        folder.close()


def stopped_at(step: int, run_dir: Path) -> str:
    """What a run that failed to write (a full disk) has kept, and how it goes on."""
    kept = saved_steps(run_dir / CHECKPOINTS)
    if not kept:
        return f"the run stopped at step {step} with no checkpoint yet"
    return (f"the run stopped at step {step}; checkpoint {kept[-1]} is kept: make room and continue with "
            f"`trainer train --resume {run_dir}`")


def _quiet(message: str) -> None:
    """The log of a process other than 0."""


def plural(n: int, noun: str) -> str:
    """ "1 step", "2 steps" """
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _mean(values) -> float:
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else 0.0


