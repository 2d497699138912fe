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
checkpoint and when the run ends (see rl_core.storage); messages name the URL.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import yaml
from rl_core import multihost, storage
from rl_core.checkpoint import CORRUPT_DIR, saved_steps
from rl_core.config import ConfigError
from rl_core.faults import fault_point
from rl_core.files import atomic_write_text, read_jsonl

from trainer import build
from trainer.evaluate import evaluate
from trainer.prompt_lengths import fit_prompts
from trainer.settings import RunSettings, build_settings, load_yaml
from trainer.signals import RunInterrupted, StopOnSignal
from trainer.tasks import Task


def final_evaluation(learner, task, settings: RunSettings, seed: int = 0) -> dict[str, float]:
    """`policy_evaluation` and the algorithm's own held-out metrics (e.g. PPO's critic)."""
    return policy_evaluation(learner, task, settings, seed) | learner.heldout_metrics(build.heldout(task, settings))


def policy_evaluation(learner, task, settings: RunSettings, seed: int = 0) -> dict[str, float]:
    """Greedy accuracy, pass@k and lengths on the held-out set."""
    return evaluate(
        learner.sampler,
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
    _write_text(path, json.dumps(metrics, indent=2))
    return metrics


def _write_text(path: Path, text: str) -> None:
    """Atomically, by process 0 alone."""
    if multihost.is_primary():
        atomic_write_text(path, text)


def load_task(settings: RunSettings, tokenizer, log: Callable[[str], None]) -> Task:
    """The task's prompts, chat-templated and cut to those that fit rollout.max_prompt_tokens."""
    task = build.chat_prompts(settings.task.build(), tokenizer)
    return fit_prompts(
        task,
        tokenizer,
        max_prompt_tokens=settings.rollout.max_prompt_tokens,
        on_long=settings.task.long_prompts,
        log=log,
    )


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
) -> dict[str, Any]:
    """Train one variant in `run_dir`; returns the summary also written to summary.json.

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
            overwrite=overwrite, reuse_base_from=reuse_base_from,
        )
    mirror = run_dir if isinstance(run_dir, storage.StagedFolder) else None
    run_dir = Path(run_dir)  # a StagedFolder: its local copy
    if not multihost.is_primary():
        log = _quiet  # process 0 speaks for the run
    _check_can_make(run_dir)
    if run_dir.exists() and not run_dir.is_dir():
        raise FileExistsError(f"output {run_dir} is a file, not a folder; choose a folder for the run")
    if resume:
        refuse_changed_settings(run_dir, settings)
        finished = _finished_summary(run_dir, settings)
        if finished is not None:
            log(
                f"{run_dir} is finished ({finished['steps']} of {settings.training.num_steps} steps); nothing to do. "
                f"Extend it with `trainer train --resume {run_dir} training.num_steps=<more>`"
            )
            return finished
        if not _check_resumable(run_dir, settings):
            _claim(run_dir, overwrite=True)  # killed before its first checkpoint: records past it never count
    else:
        _claim(run_dir, overwrite)

    # everything that reads user files, before the run folder exists
    tokenizer = build.tokenizer(settings)
    task = load_task(settings, tokenizer, log)
    model = build.new_model(settings, tokenizer)
    build.check_finite(settings, model)
    build.check_critic(settings, model)

    there = set(os.listdir(run_dir)) if run_dir.exists() else None
    run_dir.mkdir(parents=True, exist_ok=True)
    try:
        _write_config(run_dir, settings)
        policy = build.base_policy(
            settings, task, tokenizer, model, base_cache or run_dir, log, progress=progress, reuse_from=reuse_base_from
        )
        policy = build.adapted(settings, policy)
        learner = build.learner(settings, task, tokenizer, policy, output_dir=mirror or run_dir, progress=progress)
    except Exception:
        if multihost.is_primary():
            _remove_new(run_dir, there)  # a failed start leaves no half-made run folder
        raise
    # The learner trains float32 copies and keeps the loaded weights only as the reference
    # (beta > 0) or the frozen base (LoRA): with beta = 0 this frees the whole loaded model.
    del model, policy

    with StopOnSignal(log) as signals:
        before_path = run_dir / "eval_before.json"
        if resume and learner.resume(log):
            log(f"resumed {run_dir} at step {learner.step}")
            before = json.loads(before_path.read_text())
        else:
            if resume and saved_steps(run_dir / "checkpoints") == []:
                _refuse_if_checkpoints_lost(run_dir)
            before = base_evaluation(learner, task, settings, base_cache or run_dir)
            _write_text(before_path, json.dumps(before, indent=2))
        log(f"{settings.name}: held-out accuracy before RL {before['eval/accuracy']:.3f}")

        start = time.perf_counter()
        signals.stop_gracefully(learner)
        try:
            history = learner.train()
        finally:
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
        }
        if signals.received is not None:
            message = (
                f"interrupted at step {learner.step} of {settings.training.num_steps} by {signals.received.name}; "
                f"checkpoint {learner.step} saved; continue with `trainer train --resume {run_dir}`"
            )
            summary["interrupted"] = message
            _write_text(run_dir / "summary.json", json.dumps(summary, indent=2))
            raise RunInterrupted(message, 128 + signals.received.value)
        fault_point("final_eval")
        summary["after"] = final_evaluation(learner, task, settings)
        _write_text(run_dir / "summary.json", json.dumps(summary, indent=2))
    log(f"{settings.name}: held-out accuracy after RL {summary['after']['eval/accuracy']:.3f} ({plural(learner.step, 'step')})")
    return summary


RUN_FILES = (
    "checkpoints",
    "settings_at_start.json",
    CORRUPT_DIR,
    "tensorboard",
    "metrics.jsonl",
    "samples.jsonl",
    "eval_before.json",
    "summary.json",
)


def _claim(run_dir: Path, overwrite: bool) -> None:
    """Make room for a new run in `run_dir`: refuse a run or a config.yaml there unless `overwrite`."""
    existing = [name for name in (*RUN_FILES, "config.yaml") if (run_dir / name).exists()]
    if not existing:
        return
    _refuse_unless_overwrite(run_dir, existing, overwrite)
    multihost.sync("trainer.claim")  # every process found the folder as it was
    for name in existing if multihost.is_primary() else ():
        path = run_dir / name
        if name != "config.yaml":  # rewritten below, atomically
            shutil.rmtree(path) if path.is_dir() else path.unlink()


def _refuse_unless_overwrite(run_dir: Path | str, existing: Sequence[str], overwrite: bool) -> None:
    """Refuse to start a new run where `existing` run files (or a config.yaml) are, unless `overwrite`."""
    if not existing or overwrite:
        return
    if list(existing) == ["config.yaml"]:
        raise FileExistsError(
            f"{storage.child(run_dir, 'config.yaml')} exists and a run writes its settings there; choose another "
            "--output (e.g. a subfolder) or pass --overwrite to replace it"
        )
    raise FileExistsError(
        f"{run_dir} already holds a run ({', '.join(existing)}); continue it with "
        f"`trainer train --resume {run_dir}`, replace it with --overwrite, or choose another --output"
    )


STAGED_SAVES = ("checkpoints/*", "base-policy-*.partial/*", "base-policy-" + "?" * 12)
"""Orbax saves in a run folder: the checkpoints, the warm start's, the cached base policy
(`build.base_policy`). At a URL each counts only once complete (rl_core.storage)."""


def _train_at_url(settings: RunSettings, url: str, *, resume: bool, overwrite: bool, log: Callable[[str], None],
                  **kwargs: Any) -> dict[str, Any]:
    """`train_run` in a local copy of the run folder at `url`, pushed there after each checkpoint
    (by the learner's recorder) and at the end, however the run ends (a copy that cannot be pushed
    is kept, and named)."""
    folder = storage.StagedFolder(url, committed=STAGED_SAVES)
    try:
        if not resume:  # refused before anything is fetched; replaced runs are not fetched at all
            names = folder.top_level_names()
            _refuse_unless_overwrite(url, [n for n in (*RUN_FILES, "config.yaml") if n in names], overwrite)
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


NAME_MAX = 255
"""Bytes in one file or folder name on Linux and macOS file systems."""


def _check_can_make(run_dir: Path) -> None:
    """Fail now, not after the model and data are loaded, when the run folder cannot be made."""
    for part in run_dir.parts:
        if len(os.fsencode(part)) > NAME_MAX:
            raise ConfigError(
                f"output {run_dir}: the name {part[:40]!r}... is {len(os.fsencode(part))} bytes; "
                f"file systems allow {NAME_MAX}"
            )
    parent = run_dir.absolute()
    while not parent.exists():
        parent = parent.parent
    if not run_dir.exists() and not os.access(parent, os.W_OK | os.X_OK):
        raise PermissionError(f"output {run_dir}: cannot make it in {parent} (permission denied)")


def _remove_new(run_dir: Path, there: set[str] | None) -> None:
    """Remove `run_dir` if it was not there before, else what was added to it."""
    if there is None:
        shutil.rmtree(run_dir, ignore_errors=True)
        return
    for name in set(os.listdir(run_dir)) - there:
        path = run_dir / name
        shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)


def _write_config(run_dir: Path, settings: RunSettings) -> None:
    text = yaml.safe_dump(settings.resolved(), sort_keys=False)
    path = run_dir / "config.yaml"
    if not path.exists() or path.read_text() != text:
        _write_text(path, text)
    started = run_dir / STARTED
    if not started.exists() or json.loads(started.read_text()) != _comparable(settings):
        _write_text(started, json.dumps(_comparable(settings), indent=2))


STARTED = "settings_at_start.json"
"""The run's resolved settings as it started (training.num_steps as last extended): what its
checkpoints mean. A resume refuses a config.yaml edited to differ from them."""

RESUMABLE_CHANGES = ("training.num_steps",)
"""Settings a resume may change: extending the run."""

SETTINGS_ADDED = {"model.critic_confidence": False}
"""Settings added since some run folders were made whose default is not what those runs did, and
the value they ran with: a run folder whose config.yaml lacks one is resumed, evaluated and exported
with it. (A setting added at a default that reproduces earlier runs needs no entry: a folder that
lacks it takes the default.)"""


def _comparable(settings: RunSettings) -> dict[str, Any]:
    return json.loads(json.dumps(settings.resolved()))  # tuples as lists, as they read back


def refuse_changed_settings(run_dir: Path, settings: RunSettings) -> None:
    """A run is resumed, evaluated and exported with the settings its checkpoints were made
    with: an edited config.yaml (another algorithm, model, shape) is refused, naming each difference."""
    path = run_dir / STARTED
    if not path.exists():  # a run from before this record was kept
        return
    started, now = _flat(json.loads(path.read_text())), _flat(_comparable(settings))
    written = _flat(load_yaml(run_dir / "config.yaml")) if (run_dir / "config.yaml").exists() else {}
    added_since = {key for key in now if key not in started and key not in written}  # the run never had them
    changed = [
        f"{key}: {started.get(key, '(unset)')!r} -> {now.get(key, '(unset)')!r}"
        for key in sorted(set(started) | set(now))
        if key not in RESUMABLE_CHANGES and key not in added_since and started.get(key) != now.get(key)
    ]
    if changed:
        raise ConfigError(
            f"{run_dir / 'config.yaml'} differs from the settings the run started with, which its "
            f"checkpoints depend on ({'; '.join(changed)}); a resume may change only "
            f"{', '.join(RESUMABLE_CHANGES)}. Restore config.yaml, or start a new run with "
            f"`trainer train --config {run_dir / 'config.yaml'} --output NEW_FOLDER`"
        )


def _flat(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": 1}} -> {"a.b": 1}"""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            out |= _flat(value, f"{prefix}{key}.")
        else:
            out[f"{prefix}{key}"] = value
    return out


def _quiet(message: str) -> None:
    """The log of a process other than 0."""


def _finished_summary(run_dir: Path, settings: RunSettings) -> dict[str, Any] | None:
    """The summary of a run that finished all `num_steps` (nothing left to do), else None."""
    path = run_dir / "summary.json"
    if not path.exists():
        return None
    summary = json.loads(path.read_text())
    if summary.get("interrupted") or summary.get("after") is None:
        return None
    if summary["steps"] >= settings.training.num_steps:
        return summary
    return None


def _check_resumable(run_dir: Path, settings: RunSettings) -> bool:
    """True when `run_dir` has a checkpoint to continue from; False when it was killed before its
    first one (it starts over); raises when its checkpoints are gone or it is past the new total."""
    steps = saved_steps(run_dir / "checkpoints")
    if steps:
        if steps[-1] > settings.training.num_steps:
            raise ConfigError(
                f"training.num_steps = {settings.training.num_steps}: {run_dir} is already at step {steps[-1]}; "
                "a run can be extended, not shortened"
            )
        return True
    _refuse_if_checkpoints_lost(run_dir)
    return False


def _refuse_if_checkpoints_lost(run_dir: Path) -> None:
    """A run with no checkpoint left must have been killed before its first one; anything else lost them."""
    settings = settings_of_run(run_dir)
    every = settings.training.checkpoint_every_steps or settings.training.num_steps
    records, _ = read_jsonl(run_dir / "metrics.jsonl")
    past_first = [r["step"] for r in records if r["step"] > every]  # step `every` was saved before they ran
    lost = (
        (run_dir / "summary.json").exists()
        or (run_dir / CORRUPT_DIR).exists()
        or bool(past_first)
        or ((run_dir / "metrics.jsonl").exists() and not (run_dir / "checkpoints").is_dir())
    )
    if lost:
        raise FileNotFoundError(
            f"--resume {run_dir}: the run has no checkpoint to continue from (checkpoints/ was deleted or every "
            f"checkpoint is damaged), so it cannot resume; start it over with `trainer train --config "
            f"{run_dir / 'config.yaml'} --output NEW_FOLDER`, or in place with --overwrite"
        )


def plural(n: int, noun: str) -> str:
    """ "1 step", "2 steps" """
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _mean(values) -> float:
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else 0.0


def settings_of_run(run_dir: Path | str, overrides: Sequence[str] = ()) -> RunSettings:
    """The resolved settings a run folder (a path or a URL) was started with, and `overrides`."""
    path = storage.child(run_dir, "config.yaml")
    if not (storage.exists(path) if storage.is_url(path) else path.exists()):
        raise FileNotFoundError(f"{run_dir} is not a run folder: config.yaml is missing")
    written = _flat(load_yaml(path))
    legacy = [f"{key}={json.dumps(value)}" for key, value in SETTINGS_ADDED.items() if key not in written]
    return build_settings(config_file=path, overrides=[*legacy, *overrides])

