"""Run folders, checkpoints and exports at URLs (gs://, s3://, memory://, file://: any fsspec filesystem).

A run folder's guarantees rest on POSIX: records are appended line by line, a resume cuts
them back to its checkpoint's step, whole files and checkpoints appear by an atomic rename,
and fsync makes them durable. An object store has none of these: an object is written whole,
with no append, no truncation and no rename of a folder. So a folder given as a URL is worked
on in a local staging folder, exactly as a local run folder is, and mirrored to the URL with
fsspec at moments when the local copy is consistent: after each checkpoint is complete (the
recorder pushes once Orbax's background save has finished) and when the run ends. A resume
first pulls the URL's folder into staging, so its cut-back works as for a local folder.

Orbax could write checkpoints to gs:// itself, but the records beside them could not follow,
and fsspec's memory:// and file://, which tests and local mounts use, are not Orbax's: one
mechanism, stage and mirror, serves every URL with the run folder's one code path. The price
is local disk: staging holds the checkpoints kept (`training.max_checkpoints_to_keep`), under
the temporary folder (`TMPDIR`).

What a reader finds at the URL is always usable. A push uploads each new checkpoint's files
with Orbax's commit marker (`commit_success.txt` in the step folder) last, then the other new
or changed files, then deletes what the local copy no longer has (pruned checkpoints). A pull
skips a committed folder without its marker, so a push cut short (a kill, a lost connection)
leaves the previous checkpoints readable and the unfinished one invisible; records uploaded
past it are cut back by the resume like any killed run's. A push deletes only files it has
seen at the URL (pulled or pushed), never another writer's.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from filelock import FileLock

from rl_core.runtime import multihost
from rl_core.run.faults import fault_point

COMMIT_MARKER = "commit_success.txt"
"""Orbax writes it into a save's folder when the save is complete (orbax atomicity_types.COMMIT_SUCCESS_FILE)."""

COMMITTED_FOLDERS = ("checkpoints/*",)
"""Folders (fnmatch patterns, relative to the root) that count only with their COMMIT_MARKER."""

NEVER_MIRRORED = ("*.orbax-checkpoint-tmp*", ".*.tmp")
"""Names (fnmatch) of work in progress: Orbax's unfinished saves, rl_core.run.files' unrenamed rewrites."""

_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*://")


class StorageError(ValueError):
    """A URL that no installed filesystem can open, with what to install."""


def is_url(location: str | os.PathLike[str] | None) -> bool:
    """True for `scheme://...` (gs://bucket/run, memory://x, file:///tmp/x); False for plain paths."""
    return isinstance(location, str) and bool(_URL.match(location))


def child(location: str | Path, name: str) -> str | Path:
    """`location / name`, for a URL as for a path."""
    return f"{location.rstrip('/')}/{name}" if is_url(location) else Path(location) / name


def filesystem(url: str) -> tuple[Any, str]:
    """(fsspec filesystem, path inside it) of `url`; a StorageError names the package a scheme needs."""
    import fsspec
    from fsspec.registry import known_implementations

    scheme = url.split("://", 1)[0].lower()
    try:
        return fsspec.core.url_to_fs(url)
    except ImportError as e:
        known = known_implementations.get(scheme, {})
        package = known.get("class", "").split(".", 1)[0] or "its fsspec backend"
        raise StorageError(
            f"{url}: {scheme}:// needs the package {package}, which is not installed ({e}); install it "
            f"(`uv pip install {package}` or `pip install {package}`; for gs:// the trainer's extra: "
            "`uv sync --extra gcs`)"
        ) from None
    except ValueError as e:
        if scheme in known_implementations:
            raise StorageError(f"{url}: not a valid {scheme}:// URL ({e})") from None
        schemes = ", ".join(f"{s}://" for s in ("gs", "s3", "az", "hf", "memory", "file"))
        raise StorageError(
            f"{url}: no storage is known for {scheme}:// (fsspec knows e.g. {schemes}); give a local path or a "
            "URL of one of those"
        ) from None


def exists(url: str) -> bool:
    fs, path = filesystem(url)
    return fs.exists(path)


def read_bytes(url: str) -> bytes:
    """The content of the file at `url` (FileNotFoundError when there is none)."""
    fs, path = filesystem(url)
    if not fs.isfile(path):
        raise FileNotFoundError(2, "No such file", url)
    return fs.cat_file(path)


def _files(fs: Any, root: str) -> dict[str, int]:
    """rel path -> size of every file under `root` in `fs` ({} when there is no such folder)."""
    if not fs.isdir(root):
        return {}
    start = len(root.rstrip("/")) + 1
    found = fs.find(root, detail=True)
    return {name[start:]: int(info.get("size") or 0) for name, info in found.items() if info.get("type") != "directory"}


def _matches(rel: str, patterns: Iterable[str]) -> str | None:
    """The folder holding `rel` that one of `patterns` matches (as many components as the pattern has)."""
    parts = rel.split("/")
    for pattern in patterns:
        n = pattern.count("/") + 1
        if len(parts) > n and fnmatch.fnmatchcase("/".join(parts[:n]), pattern):
            return "/".join(parts[:n])
    return None


def _mirrored(rel: str) -> bool:
    return not any(fnmatch.fnmatchcase(part, p) for part in rel.split("/") for p in NEVER_MIRRORED)


def _local_files(root: Path) -> dict[str, tuple[int, int]]:
    """rel path -> (size, mtime_ns) of every mirrored file under `root`."""
    if not root.is_dir():
        return {}
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if _mirrored(d)]
        for name in filenames:
            path = Path(dirpath) / name
            rel = path.relative_to(root).as_posix()
            if _mirrored(rel):
                stat = path.stat()
                out[rel] = (stat.st_size, stat.st_mtime_ns)
    return out


class StagedFolder(os.PathLike):
    """The folder at `url`, worked on in a local copy (`local`, a fresh temporary folder).

    `pull` makes the copy (the URL's committed content), `push` mirrors it back, `close`
    removes it. As an os.PathLike it is the local copy, so `Path(folder)` works on it; `shown`
    turns a message about the copy into one about the URL.
    """

    def __init__(self, url: str, *, committed: Sequence[str] = COMMITTED_FOLDERS) -> None:
        if multihost.multi_process():
            raise StorageError(
                f"{url}: a multi-process run needs one run folder every process shares; give a path on a shared "
                "file system (e.g. the bucket mounted with gcsfuse) instead of a URL"
            )
        self.url = url.rstrip("/")
        self.fs, self.root = filesystem(self.url)
        self.root = self.root.rstrip("/")
        self.committed = tuple(committed)
        name = self.root.rsplit("/", 1)[-1] or "folder"
        self._staging = Path(tempfile.mkdtemp(prefix="rl-variants-staging-"))
        self.local = self._staging / name
        self.pulled = False
        """True once `pull` completed: only then may `push` delete what the copy lacks."""
        self._at_url: dict[str, tuple[int, int] | None] = {}
        """Files seen at the URL: the (size, mtime_ns) of the local file they hold, or None when
        they hold nothing the local copy has (an unfinished save, a file since removed)."""

    def __fspath__(self) -> str:
        return str(self.local)

    def __repr__(self) -> str:
        return f"StagedFolder({self.url!r}, local={str(self.local)!r})"

    def shown(self, text: str) -> str:
        """`text` with the local copy's path replaced by the URL."""
        return text.replace(str(self.local), self.url)

    def _remote(self, rel: str) -> str:
        return f"{self.root}/{rel}"

    def remote_files(self) -> dict[str, int]:
        """rel path -> size of every file at the URL."""
        if self.fs.isfile(self.root):
            raise FileExistsError(f"{self.url} is a file, not a folder; choose a folder for the run")
        return _files(self.fs, self.root)

    def top_level_names(self) -> set[str]:
        """The names directly in the folder at the URL."""
        return {rel.split("/", 1)[0] for rel in self.remote_files()}

    def pull(self, *, skip: Sequence[str] = ()) -> None:
        """Copy the URL's committed content into `local` (the top-level names in `skip` are left out:
        they are known, so a push deletes them at the URL unless the local copy makes them anew)."""
        remote = self.remote_files()
        folders = {folder for rel in remote if (folder := _matches(rel, self.committed)) is not None}
        unfinished = {folder for folder in folders if f"{folder}/{COMMIT_MARKER}" not in remote}
        wanted = [
            rel for rel in sorted(remote)
            if _mirrored(rel) and _matches(rel, self.committed) not in unfinished and rel.split("/", 1)[0] not in skip
        ]
        for rel in wanted:
            (self.local / rel).parent.mkdir(parents=True, exist_ok=True)
        if wanted:
            self.fs.get([self._remote(rel) for rel in wanted], [str(self.local / rel) for rel in wanted])
        self._at_url = dict.fromkeys(remote)
        for rel in wanted:
            stat = (self.local / rel).stat()
            self._at_url[rel] = (stat.st_size, stat.st_mtime_ns)
        self.pulled = True

    def push(self) -> None:
        """Mirror the local copy to the URL: new checkpoints (each marker last), other new or
        changed files, then deletions of what the copy no longer has."""
        if not self.pulled:  # a copy that is not the URL's would delete what it lacks
            raise RuntimeError(f"{self!r}: push before a complete pull, or after close")
        if not self.local.is_dir() and any(stat is not None for stat in self._at_url.values()):
            raise RuntimeError(f"{self!r}: the local copy is gone; the URL keeps what it has")
        local = _local_files(self.local)
        changed = [rel for rel, stat in sorted(local.items()) if self._at_url.get(rel) != stat]
        committed = [rel for rel in changed if _matches(rel, self.committed) is not None]
        markers = [rel for rel in committed if rel == f"{_matches(rel, self.committed)}/{COMMIT_MARKER}"]
        data = [rel for rel in committed if rel not in markers]
        others = [rel for rel in changed if rel not in committed]
        # a folder saved anew over a complete one at the URL (a replaced run) stops counting first
        stale = sorted({f"{_matches(rel, self.committed)}/{COMMIT_MARKER}" for rel in data} & set(self._at_url))
        if stale:
            self.fs.rm([self._remote(rel) for rel in stale])
            for rel in stale:
                del self._at_url[rel]
            markers = sorted(set(markers) | {rel for rel in stale if rel in local})
        for stage, group in (("data", data), ("markers", markers), ("others", others)):
            self._upload(group, local)
            fault_point("push", stage)
        gone = [rel for rel in self._at_url if rel not in local]
        # a committed folder stops counting with its marker, before its data goes
        gone.sort(key=lambda rel: (not rel.endswith(f"/{COMMIT_MARKER}"), rel))
        if gone:
            self.fs.rm([self._remote(rel) for rel in gone])
            for rel in gone:
                del self._at_url[rel]
            self._remove_empty_folders(gone)

    def _remove_empty_folders(self, removed: list[str]) -> None:
        """Folders left empty by `removed` (file://: real ones; object stores have none)."""
        folders = {"/".join(rel.split("/")[:i]) for rel in removed for i in range(1, rel.count("/") + 1)}
        for folder in sorted(folders, key=lambda f: -f.count("/")):
            path = self._remote(folder)
            try:
                if self.fs.isdir(path) and not self.fs.ls(path):
                    self.fs.rmdir(path)
            except OSError:  # another writer's file appeared, or the store has no folders
                pass

    def _upload(self, rels: list[str], local: dict[str, tuple[int, int]]) -> None:
        if not rels:
            return
        for folder in sorted({self._remote(rel).rsplit("/", 1)[0] for rel in rels}):
            self.fs.makedirs(folder, exist_ok=True)  # object stores: nothing; file://: the folders
        self.fs.put([str(self.local / rel) for rel in rels], [self._remote(rel) for rel in rels])
        for rel in rels:
            self._at_url[rel] = local[rel]

    def close(self) -> None:
        """Remove the local copy (push first to keep what it has)."""
        self.pulled = False
        shutil.rmtree(self._staging, ignore_errors=True)


def open_staged(url: str, *, committed: Sequence[str] = COMMITTED_FOLDERS,
                skip: Sequence[str] = ()) -> StagedFolder:
    """A StagedFolder of `url` with its content pulled."""
    folder = StagedFolder(url, committed=committed)
    try:
        folder.pull(skip=skip)
    except BaseException:
        folder.close()
        raise
    return folder


def replace_folder(local: str | Path, url: str, *, last: Sequence[str] = ()) -> list[str]:
    """Make the folder at `url` hold the files of `local`: upload them, the names in `last` after
    all others (a reader that waits for them finds the rest complete), then remove the files that
    were there before and are not among them. Returns the files' relative paths."""
    fs, root = filesystem(url)
    root = root.rstrip("/")
    before = _files(fs, root)
    files = sorted(p.relative_to(local).as_posix() for p in Path(local).rglob("*") if p.is_file())
    for group in ([f for f in files if f not in last], [f for f in files if f in last]):
        if group:
            for folder in sorted({f"{root}/{rel}".rsplit("/", 1)[0] for rel in group}):
                fs.makedirs(folder, exist_ok=True)
            fs.put([str(Path(local) / rel) for rel in group], [f"{root}/{rel}" for rel in group])
    stale = sorted(set(before) - set(files))
    if stale:
        fs.rm([f"{root}/{rel}" for rel in stale])
    return files


def listing(url: str) -> tuple[bool, list[str]]:
    """(whether `url` is a file, the names directly in the folder at `url`)."""
    fs, root = filesystem(url)
    if fs.isfile(root):
        return True, []
    return False, sorted({rel.split("/", 1)[0] for rel in _files(fs, root)})


def cached_copy(url: str, cache_dir: str | Path, *, only: Sequence[str] | None = None) -> Path:
    """A local copy of the folder at `url` (e.g. a model to load), or of the files named in
    `only`, kept in `cache_dir` and fetched again when the URL's files (names and sizes) differ."""
    fs, root = filesystem(url)
    root = root.rstrip("/")
    files = {rel: size for rel, size in _files(fs, root).items() if only is None or rel in only}
    if not files:
        raise FileNotFoundError(2, "No such folder, or none of its files", url)
    what = json.dumps([url.rstrip("/"), None if only is None else sorted(only)])
    slot = Path(cache_dir) / hashlib.sha256(what.encode()).hexdigest()[:16]
    target, listing = slot / (root.rsplit("/", 1)[-1] or "folder"), slot / "listing.json"
    slot.mkdir(parents=True, exist_ok=True)
    with FileLock(str(slot / ".lock")):  # processes of one machine fetch it once
        if target.is_dir() and listing.is_file() and json.loads(listing.read_text()) == files:
            return target
        partial = target.with_name(target.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        for rel in files:
            (partial / rel).parent.mkdir(parents=True, exist_ok=True)
        names = sorted(files)
        fs.get([f"{root}/{rel}" for rel in names], [str(partial / rel) for rel in names])
        shutil.rmtree(target, ignore_errors=True)
        os.replace(partial, target)
        listing.write_text(json.dumps(files, sort_keys=True))
    return target
