"""Orbax checkpoints of the whole training state, for exact resume.

A checkpoint holds params, optimizer state and the PRNG key as arrays, and a
JSON record of the step, the data position and whatever the algorithm adds
(`rl_core.learner.state.state_meta`: the carry and the batches in flight as their own JSON).

A save is written to a temporary folder (`<step>.orbax-checkpoint-tmp`) and
renamed to `<step>` when complete, so a step folder on disk is a finished
save; the temporary folder of a save that was killed is removed when the next
Checkpointer opens the folder. A checkpoint that exists but does not restore
(damaged on disk) is moved aside, never deleted, and the one before it is used.

Saves are asynchronous: `save` returns once the arrays are copied off the
devices (training goes on, and may donate their buffers), and Orbax writes
them in a background thread. The next save, `wait` and `close` wait for it, so
at most one save is in flight; a kill during it leaves the one before intact.
The learner waits at the end of the next step's update, so the write overlaps
that step's rollout and update and is on disk before its records are.

A save that cannot be written (a full disk, a quota, an I/O error) raises an OSError naming
the checkpoint's folder, from `save` or from the `wait` after it, instead of Orbax's
tracebacks from its threads; the checkpoints before it are kept. `save` checks first that
the file system has room for one more checkpoint the size of the last one,
so a full disk is usually found before anything is written.

In a multi-process run every process calls `save` and `restore` (each writes
and reads its own shards, Orbax synchronises them); only process 0 removes
temporary folders and moves damaged checkpoints aside, the others waiting at a
barrier so that all open the same list of steps.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import orbax.checkpoint as ocp

from rl_core.runtime import multihost
from rl_core.run.faults import fault_point
from rl_core.run.layout import CORRUPT_CHECKPOINTS

TMP_SUFFIX = ".orbax-checkpoint-tmp"
"""Orbax writes step N into `N.orbax-checkpoint-tmp` and renames it to `N` when complete."""


def saved_steps(directory: str | Path) -> list[int]:
    """Steps with a finished checkpoint in `directory` (temporary folders of unfinished saves excluded)."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    return sorted(int(p.name) for p in directory.iterdir() if p.is_dir() and p.name.isdigit())


def remove_unfinished_saves(directory: str | Path) -> None:
    """Remove the temporary folders of saves a killed process left in `directory`.

    Done here, before a manager opens the folder, rather than by Orbax's own
    cleanup, which runs in a background thread and could race a new save of the same step.
    """
    directory = Path(directory)
    if directory.is_dir():
        for path in directory.iterdir():
            if path.is_dir() and TMP_SUFFIX in path.name:
                shutil.rmtree(path)


def damage_reason(error: BaseException, limit: int = 300) -> str:
    """`Type: message` of the innermost cause of a failed restore, on one line.

    Orbax wraps tensorstore's error in an Exception whose text ends in a bound method's
    repr ("See full TensorStore details: <bound method ...>"), and tensorstore appends
    its whole JSON spec (and, in some releases such as 0.1.85, the C++ source lines it passed
    through): these are cut, so what is left names the file and what is wrong
    with it (e.g. "Error decoding manifest: Encoded length (3) is less than minimum length
    (16)"); a long message keeps its start and its end, where that detail is.
    """
    inner, seen = error, {id(error)}
    while inner.__cause__ is not None and id(inner.__cause__) not in seen:  # `raise ... from`, not `during handling`
        inner = inner.__cause__
        seen.add(id(inner))
    text = str(inner)
    for noise in (" [tensorstore_spec", " [source locations=", " See full TensorStore details", "See full TensorStore details"):
        text = text.split(noise, 1)[0]
    text = " ".join(text.split()) or "no message"
    if len(text) > limit:
        text = f"{text[: limit // 3]} ... {text[-(limit - limit // 3 - 5):]}"
    return f"{type(inner).__name__}: {text}"


SPACE_MARGIN = 64 * 1024
"""Bytes a save is expected to need beyond the size of the checkpoint before it."""


def folder_bytes(path: str | Path) -> int:
    """Bytes in the files under `path`."""
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())


def write_failure(error: BaseException, where: str | Path) -> OSError | None:
    """The file-system error a failed save comes down to, naming `where`: an OSError among its
    causes, or tensorstore's `... No space left on device [os_error_code='28']`, which Orbax
    raises as a ValueError. None when the failure is not the file system's."""
    seen: set[int] = set()
    inner: BaseException | None = error
    while inner is not None and id(inner) not in seen:
        seen.add(id(inner))
        code = inner.errno if isinstance(inner, OSError) else None
        if code is None:
            found = re.search(r"os_error_code='?(\d+)", str(inner))
            code = int(found.group(1)) if found else None
        if code:
            return OSError(code, os.strerror(code), str(where))
        inner = inner.__cause__ or inner.__context__
    return None


class _SaveErrors(logging.Filter):
    """Orbax logs a failed save's error, with a traceback, from each of its threads (and asyncio
    its abandoned futures); `save` or `wait` raises it once, as an OSError, so a Checkpointer that
    writes drops these records while it is open."""

    loggers = ("absl", "asyncio")

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno < logging.ERROR or not ("orbax" in record.pathname or record.name == "asyncio")

    def attach(self) -> None:
        for name in self.loggers:
            logging.getLogger(name).addFilter(self)

    def detach(self) -> None:
        for name in self.loggers:
            logging.getLogger(name).removeFilter(self)


class _ReadOnlyNotice(logging.Filter):
    """Orbax warns "Given directory is read only=..." whenever it opens a folder to read it, as
    `trainer eval` and `trainer export` do: that is what they asked for, not a warning."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Given directory is read only")


@contextlib.contextmanager
def _without_read_only_notice():
    absl_logger, notice = logging.getLogger("absl"), _ReadOnlyNotice()
    absl_logger.addFilter(notice)
    try:
        yield
    finally:
        absl_logger.removeFilter(notice)


class Checkpointer:
    def __init__(self, directory: str | Path, *, max_to_keep: int = 2, read_only: bool = False) -> None:
        """`read_only`: only restore (e.g. to evaluate a run that may still be training and saving)."""
        self.directory = Path(directory).absolute()
        self.max_to_keep = max_to_keep
        self.read_only = read_only
        self._manager = self._open()
        self._in_flight: int | None = None  # the step whose save was started and not waited for
        self._failed = False
        self._save_errors = _SaveErrors()
        if not read_only:
            self._save_errors.attach()

    def _open(self) -> ocp.CheckpointManager:
        if not self.read_only:
            if multihost.is_primary():
                remove_unfinished_saves(self.directory)
            multihost.sync("rl_core.run.checkpoint.open")
        options = ocp.CheckpointManagerOptions(
            # read-only: the values Orbax would set itself, each with a warning
            max_to_keep=None if self.read_only else self.max_to_keep,
            save_interval_steps=0 if self.read_only else 1,
            create=not self.read_only,
            read_only=self.read_only,
            enable_async_checkpointing=True,
        )
        with _without_read_only_notice():
            return ocp.CheckpointManager(self.directory, options=options)


    def latest_step(self) -> int | None:
        return self._manager.latest_step()

    def steps(self) -> list[int]:
        return sorted(self._manager.all_steps())

    def save(self, step: int, *, arrays: Any, meta: dict[str, Any]) -> None:
        """Start saving `step` and return once the arrays are off the devices; the files are
        written in the background (a step folder on disk is still a complete save).

        The previous save is finished first, and the old checkpoints pruned then.
        """
        self.wait()
        self._check_room(step)
        self._in_flight = step
        try:
            self._manager.save(
                step,
                args=ocp.args.Composite(arrays=ocp.args.StandardSave(arrays), meta=ocp.args.JsonSave(meta)),
                force=True,
            )
        except Exception as e:
            raise self._failed_save(e) from None
        fault_point("checkpoint", step)  # the save is under way in its temporary folder

    def _check_room(self, step: int) -> None:
        """An OSError (no space left) when the file system cannot hold one more checkpoint the size
        of the last one."""
        where = self.directory / str(step)
        try:
            fault_point("write", f"checkpoints:{step}")
        except OSError as e:
            raise OSError(e.errno, e.strerror, str(where)) from None
        steps = self.steps()
        if not steps:  # nothing to measure: the arrays' bytes overstate what Orbax writes (it compresses)
            return
        needed = folder_bytes(self.directory / str(steps[-1])) + SPACE_MARGIN
        free = shutil.disk_usage(self.directory).free
        if free < needed:
            raise OSError(
                28, f"{os.strerror(28)} (checkpoint {step} needs about {needed / 2**20:.1f} MiB, "
                f"{free / 2**20:.1f} MiB free)", str(where),
            )

    def _failed_save(self, error: Exception) -> Exception:
        """The error to raise for a save that failed: the file system's, naming the checkpoint."""
        step, self._in_flight, self._failed = self._in_flight, None, True
        gc.collect()  # Orbax's abandoned writes end now, not in errors at interpreter exit
        return write_failure(error, self.directory / str(step)) or error

    def wait(self) -> None:
        """Finish the save in flight, if any, and prune."""
        try:
            self._manager.wait_until_finished()
        except Exception as e:
            raise self._failed_save(e) from None
        self._in_flight = None
        if not self.read_only:
            self.prune()

    def prune(self) -> None:
        """Delete all but the newest `max_to_keep` checkpoints (also those an earlier process left)."""
        for step in self.steps()[: -self.max_to_keep]:
            self._manager.delete(step)

    def restore(self, step: int, *, like: Any) -> tuple[Any, dict[str, Any]]:
        """(arrays shaped and sharded like `like`, meta) of checkpoint `step`."""
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, like)
        restored = self._manager.restore(
            step,
            args=ocp.args.Composite(arrays=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore()),
        )
        return restored["arrays"], dict(restored["meta"])

    def restore_latest(
        self, *, like: Any, log: Callable[[str], None] = print
    ) -> tuple[int, Any, dict[str, Any]] | None:
        """(step, arrays, meta) of the newest checkpoint that restores, or None when none does.

        Each newer one that fails is moved to `CORRUPT_CHECKPOINTS` beside the folder, with one line in `log`.
        """
        self.wait()  # a save of this Checkpointer still in flight counts once it is on disk
        for step in reversed(self.steps()):
            try:
                arrays, meta = self.restore(step, like=like)
            except Exception as e:  # noqa: BLE001 - Orbax, tensorstore and JSON raise many kinds
                moved = self._move_aside(step)
                log(f"checkpoint {step} does not restore ({damage_reason(e)}); moved it to {moved}")
                continue
            return step, arrays, meta
        return None

    def _move_aside(self, step: int) -> Path:
        target_dir = self.directory.parent / CORRUPT_CHECKPOINTS
        target = target_dir / str(step)
        n = 1
        while target.exists():
            n += 1
            target = target_dir / f"{step}-{n}"
        multihost.sync(f"rl_core.run.checkpoint.move_aside.{step}")  # every process named the same target
        if multihost.is_primary():
            target_dir.mkdir(exist_ok=True)
            shutil.move(str(self.directory / str(step)), str(target))
        self._manager.close()
        self._manager = self._open()  # it lists the steps it finds when opened
        return target

    def close(self) -> None:
        """Finish the save in flight and release the manager (after a failed save, without
        raising its error again)."""
        try:
            if not self._failed:
                self.wait()
            with contextlib.suppress(Exception) if self._failed else contextlib.nullcontext():
                self._manager.close()
        finally:
            self._save_errors.detach()
