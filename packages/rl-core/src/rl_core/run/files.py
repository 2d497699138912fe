"""Run-folder files that survive a kill at any moment.

Records are appended one JSON line at a time, so a kill can leave at most the
last line torn; readers drop it. Whole-file rewrites go through a temporary
file, fsync and an atomic rename, so a kill leaves either the old file or the
new one, never an empty or half-written one.

A write that fails (a full disk, a quota, an I/O error) raises an OSError that names the file
(`write_error`), for the CLI's one line; a rewrite's temporary file is removed first.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from rl_core.run.faults import fault_point


class RunFileError(ValueError):
    """A run-folder file is damaged beyond what a kill can do (e.g. a bad line in the middle)."""


def write_error(error: OSError, path: str | Path) -> OSError:
    """`error` naming `path` when it names no file (a write's or flush's `[Errno 28] No space left
    on device` names none), else `error` itself."""
    if error.filename is not None or error.errno is None:
        return error
    return OSError(error.errno, error.strerror or os.strerror(error.errno), str(path))


def append_text(path: str | Path, text: str, *, step: int | None = None) -> None:
    """Append `text` (whole lines) to `path`; a failed write raises an OSError naming `path`
    (a line cut by it reads as torn, and is dropped like one a kill cut)."""
    path = Path(path)
    try:
        fault_point("write", path.name if step is None else f"{path.name}:{step}")
        with path.open("a", encoding="utf-8") as f:
            f.write(text)
    except OSError as e:
        raise write_error(e, path) from None


def atomic_write_text(path: str | Path, text: str) -> None:
    """Replace `path` with `text`: the old content or the new, whatever happens when."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        fault_point("write", path.name)
        with tmp.open("w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        tmp.unlink(missing_ok=True)  # the old file stays as it was; no half-written temporary is left
        raise write_error(e, path) from None
    fault_point("rewrite", path.stem)
    os.replace(tmp, path)
    _fsync_folder(path.parent)


def _fsync_folder(folder: Path) -> None:
    """Make a rename in `folder` durable (a power cut cannot bring the old name back)."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_jsonl(path: str | Path) -> tuple[list[dict[str, Any]], bool]:
    """(records, whether a torn last line was dropped) of a JSONL file written line by line.

    A last line without its newline was cut by a kill mid-write and is dropped;
    a bad line anywhere else is a RunFileError naming the file and the line.
    """
    path = Path(path)
    if not path.exists():
        return [], False
    text = path.read_text(encoding="utf-8", errors="replace")
    lines = text.split("\n")
    torn = lines.pop() != ""  # text after the last newline: an unfinished write
    records = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise RunFileError(f"{path}:{number}: not valid JSON ({e.msg}); the file is damaged") from None
        if not isinstance(record, dict) or not isinstance(record.get("step"), int):
            raise RunFileError(f"{path}:{number}: expected an object with an int 'step', got {line[:80]!r}")
        records.append(record)
    return records, torn


def keep_records_through(path: str | Path, step: int) -> list[dict[str, Any]]:
    """Rewrite a JSONL file of step records to those of steps <= `step`; returns them.

    A resumed run drops what the killed one wrote after its last checkpoint, so
    the file reads as one uninterrupted run.
    """
    path = Path(path)
    records, torn = read_jsonl(path)
    kept = [r for r in records if r["step"] <= step]
    if torn or len(kept) != len(records):
        atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in kept))
    return kept
