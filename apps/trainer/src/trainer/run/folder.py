"""A run folder's files: making room for a run, the settings it started with, and whether
it can resume.

A run folder holds config.yaml (the user's, or the resolved settings), settings_at_start.json
(what its checkpoints mean, and what its "auto" settings picked), checkpoints/, metrics.jsonl,
samples.jsonl, tensorboard/, eval_before.json and summary.json. Only process 0 writes
(`write_text`); every process reads the same files and takes the same decisions.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from rl_core.runtime import multihost
from rl_core.run import (
    atomic_write_text, CHECKPOINTS, CONFIG, CORRUPT_CHECKPOINTS, METRICS, read_jsonl, RUN_FILES, saved_steps,
    SETTINGS_AT_START, storage, SUMMARY,
)
from rl_core import ConfigError
from rl_core.rollout import moved_into_options, resolve_engine

from trainer.settings import RunSettings, build_settings, load_yaml


def write_text(path: Path, text: str) -> None:
    """Atomically, by process 0 alone."""
    if multihost.is_primary():
        atomic_write_text(path, text)


def claim(run_dir: Path, overwrite: bool, keep: Sequence[str] = ()) -> None:
    """Make room for a new run in `run_dir`: refuse a run or a config.yaml there unless `overwrite`;
    the files named in `keep` stay."""
    existing = [name for name in (*RUN_FILES, CONFIG) if (run_dir / name).exists() and name not in keep]
    if not existing:
        return
    refuse_unless_overwrite(run_dir, existing, overwrite)
    multihost.sync("trainer.claim")  # every process found the folder as it was
    for name in existing if multihost.is_primary() else ():
        path = run_dir / name
        if name != CONFIG:  # rewritten below, atomically
            shutil.rmtree(path) if path.is_dir() else path.unlink()


def refuse_unless_overwrite(run_dir: Path | str, existing: Sequence[str], overwrite: bool) -> None:
    """Refuse to start a new run where `existing` run files (or a config.yaml) are, unless `overwrite`."""
    if not existing or overwrite:
        return
    if list(existing) == [CONFIG]:
        raise FileExistsError(
            f"{storage.child(run_dir, 'config.yaml')} exists and a run writes its settings there; choose another "
            "--output (e.g. a subfolder) or pass --overwrite to replace it"
        )
    raise FileExistsError(
        f"{run_dir} already holds a run ({', '.join(existing)}); continue it with "
        f"`trainer train --resume {run_dir}`, replace it with --overwrite, or choose another --output"
    )


NAME_MAX = 255
"""Bytes in one file or folder name on Linux and macOS file systems."""


def check_can_make(run_dir: Path) -> None:
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


def remove_new(run_dir: Path, there: set[str] | None) -> None:
    """Remove `run_dir` if it was not there before, else what was added to it."""
    if there is None:
        shutil.rmtree(run_dir, ignore_errors=True)
        return
    for name in set(os.listdir(run_dir)) - there:
        path = run_dir / name
        shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)


def write_config(run_dir: Path, settings: RunSettings) -> None:
    text = yaml.safe_dump(settings.resolved(), sort_keys=False)
    path = run_dir / CONFIG
    if not path.exists() or path.read_text() != text:
        write_text(path, text)
    started = run_dir / SETTINGS_AT_START
    record = _comparable(settings) | {PICKED: picked(settings)}
    if not started.exists() or json.loads(started.read_text()) != record:
        write_text(started, json.dumps(record, indent=2))


"""The run's resolved settings as it started (training.num_steps as last extended): what its
checkpoints mean. A resume refuses a config.yaml edited to differ from them."""

RESUMABLE_CHANGES = ("training.num_steps",)
"""Settings a resume may change: extending the run."""

SETTINGS_ADDED = {"model.critic_confidence": False}
"""Settings added since some run folders were made whose default is not what those runs did, and
the value they ran with: a run folder whose config.yaml lacks one is resumed, evaluated and exported
with it. (A setting added at a default that reproduces earlier runs needs no entry: a folder that
lacks it takes the default.)"""


PICKED = "picked"
"""settings_at_start.json's record of what the "auto" settings picked when the run started (by dotted
name): what the run did, not settings; a resume picks again (and records it) rather than being refused."""


def picked(settings: RunSettings) -> dict[str, Any]:
    """What the run's "auto" settings resolve to: the rollout engine (the trainer's learners
    have the paged adapter, so its shape alone decides)."""
    return {"rollout.engine": resolve_engine(settings.rollout)}


def _comparable(settings: RunSettings) -> dict[str, Any]:
    return json.loads(json.dumps(settings.resolved()))  # tuples as lists, as they read back


def refuse_changed_settings(run_dir: Path, settings: RunSettings) -> None:
    """A run is resumed, evaluated and exported with the settings its checkpoints were made
    with: an edited config.yaml (another algorithm, model, shape) is refused, naming each difference."""
    path = run_dir / SETTINGS_AT_START
    if not path.exists():  # a run from before this record was kept
        return
    record = json.loads(path.read_text())
    record.pop(PICKED, None)  # not settings (see PICKED)
    if isinstance(record.get("rollout"), dict):  # a run started before engines carried their settings
        record["rollout"] = moved_into_options(record["rollout"])
    started, now = flat(record), flat(_comparable(settings))
    written = flat(load_yaml(run_dir / CONFIG)) if (run_dir / CONFIG).exists() else {}
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


def flat(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": 1}} -> {"a.b": 1} (settings as dotted keys; trainer show reads them too)"""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            out |= flat(value, f"{prefix}{key}.")
        else:
            out[f"{prefix}{key}"] = value
    return out


def finished_summary(run_dir: Path, settings: RunSettings) -> dict[str, Any] | None:
    """The summary of a run that finished all `num_steps` (nothing left to do), else None."""
    path = run_dir / SUMMARY
    if not path.exists():
        return None
    summary = json.loads(path.read_text())
    if summary.get("interrupted") or summary.get("after") is None:
        return None
    if summary["steps"] >= settings.training.num_steps:
        return summary
    return None


def refuse_shortening(run_dir: Path, settings: RunSettings) -> None:
    """A resume whose training.num_steps is below the steps the run has already done (its summary's,
    or its newest checkpoint's) is an error naming them: a run can be extended, not shortened."""
    done = saved_steps(run_dir / CHECKPOINTS)[-1:]
    path = run_dir / SUMMARY
    if path.exists():
        done.append(int(json.loads(path.read_text()).get("steps", 0)))
    steps = max(done, default=0)
    if steps > settings.training.num_steps:
        raise ConfigError(
            f"training.num_steps = {settings.training.num_steps}: {run_dir} has already done {steps} steps; "
            f"a run can be extended, not shortened (give training.num_steps >= {steps}, or start a new run)"
        )


def check_resumable(run_dir: Path, settings: RunSettings) -> bool:
    """True when `run_dir` has a checkpoint to continue from; False when it was killed before its
    first one (it starts over); raises when its checkpoints are gone (`refuse_shortening` has
    refused a new total below the steps done)."""
    steps = saved_steps(run_dir / CHECKPOINTS)
    if steps:
        return True
    refuse_if_checkpoints_lost(run_dir)
    return False


def refuse_if_checkpoints_lost(run_dir: Path) -> None:
    """A run with no checkpoint left must have been killed before its first one; anything else lost them."""
    settings = settings_of_run(run_dir)
    every = settings.training.checkpoint_every_steps or settings.training.num_steps
    records, _ = read_jsonl(run_dir / METRICS)
    past_first = [r["step"] for r in records if r["step"] > every]  # step `every` was saved before they ran
    lost = (
        (run_dir / SUMMARY).exists()
        or (run_dir / CORRUPT_CHECKPOINTS).exists()
        or bool(past_first)
        or ((run_dir / METRICS).exists() and not (run_dir / CHECKPOINTS).is_dir())
    )
    if lost:
        raise FileNotFoundError(
            f"--resume {run_dir}: the run has no checkpoint to continue from (checkpoints/ was deleted or every "
            f"checkpoint is damaged), so it cannot resume; start it over with `trainer train --config "
            f"{run_dir / 'config.yaml'} --output NEW_FOLDER`, or in place with --overwrite"
        )


def settings_of_run(run_dir: Path | str, overrides: Sequence[str] = ()) -> RunSettings:
    """The resolved settings a run folder (a path or a URL) was started with, and `overrides`."""
    path = storage.child(run_dir, CONFIG)
    if not (storage.exists(path) if storage.is_url(path) else path.exists()):
        raise FileNotFoundError(f"{run_dir} is not a run folder: config.yaml is missing")
    written = flat(load_yaml(path))
    legacy = [f"{key}={json.dumps(value)}" for key, value in SETTINGS_ADDED.items() if key not in written]
    return build_settings(config_file=path, overrides=[*legacy, *overrides])
