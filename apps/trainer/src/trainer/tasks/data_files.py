"""Rows of a local data path: JSONL, a JSON array, Parquet, a folder of Parquet shards,
or a folder written by `datasets.save_to_disk` (Arrow files, read with pyarrow).

Every row comes with where it was read (`file:line` for JSON lines, `file:row`
otherwise), so a bad row can be reported precisely. A split name ("train",
"test", ...) picks a split of a folder: the `<split>/` sub-folder of a saved
DatasetDict, or the Parquet shards named `<split>-*.parquet` / `<split>.parquet`
or placed under a `<split>/` folder (the Hugging Face Hub's layouts).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

Row = tuple[str, int, Mapping[str, Any]]
"""(where: `file:line` or `file:row n`, the line or row number from 1, the row)."""


class DataError(ValueError):
    """A data file or one of its rows is malformed."""


def read_rows(path: str | Path, split: str | None = None) -> Iterator[Row]:
    """(where, number, row) for every row of `path` (a file or a folder), in order."""
    path = Path(path)
    if not path.exists():
        raise DataError(f"data path {str(path)!r} does not exist")
    if path.is_dir():
        yield from _folder_rows(path, split)
        return
    if split is not None:
        raise DataError(f"{path}: a split ({split!r}) can only be chosen in a folder; this is a single file")
    if path.suffix == ".parquet":
        yield from _parquet_rows(path)
    elif path.suffix == ".arrow":
        yield from _arrow_rows(path)
    elif path.suffix in (".jsonl", ".json"):
        yield from _json_rows(path)
    else:
        raise DataError(f"{path}: unsupported data file type {path.suffix!r}; use .jsonl, .json, .parquet or a folder")


def _text(path: Path) -> str:
    data = path.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        column = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
        raise DataError(
            f"{path}:{line}: not UTF-8 text (byte 0x{data[e.start]:02x} at column {column}); "
            "save the file as UTF-8"
        ) from None


def _json_rows(path: Path) -> Iterator[Row]:
    text = _text(path)
    if text.lstrip().startswith("["):  # one JSON array of objects
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as e:
            raise DataError(f"{path}:{e.lineno}: not valid JSON ({e.msg})") from None
        for number, row in enumerate(rows, start=1):
            yield _object(f"{path}:row {number}", number, row)
        return
    if path.suffix == ".json" and text.lstrip().startswith("{"):
        try:
            whole = json.loads(text)
        except json.JSONDecodeError:
            whole = None  # JSON lines in a .json file
        if isinstance(whole, dict):
            raise DataError(
                f"{path}: holds a single JSON object ({len(whole)} keys), not rows; expected a JSON array of "
                "objects ([{...}, {...}]) or one object per line (JSONL)"
            )
    # split on "\n" only: str.splitlines also breaks at U+2028, U+0085 and other characters
    # that valid JSON strings hold (web-scraped text has them)
    for number, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise DataError(f"{path}:{number}: not valid JSON ({e.msg})") from None
        yield _object(f"{path}:{number}", number, row)


def _object(where: str, number: int, row: Any) -> Row:
    if not isinstance(row, dict):
        raise DataError(f"{where}: expected a JSON object, got {type(row).__name__}")
    return where, number, row


def _parquet_rows(path: Path) -> Iterator[Row]:
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except Exception as e:  # noqa: BLE001 - pyarrow raises several kinds
        raise DataError(f"{path}: not a readable Parquet file: {e}") from None
    for number, row in enumerate(table.to_pylist(), start=1):
        yield f"{path}:row {number}", number, row


def _arrow_rows(path: Path) -> Iterator[Row]:
    """An Arrow file as `datasets` writes it (the IPC stream format; the file format also works)."""
    import pyarrow as pa

    try:
        with pa.memory_map(str(path)) as source:
            try:
                table = pa.ipc.open_stream(source).read_all()
            except pa.ArrowInvalid:
                source.seek(0)
                table = pa.ipc.open_file(source).read_all()
    except Exception as e:  # noqa: BLE001 - pyarrow raises several kinds
        raise DataError(f"{path}: not a readable Arrow file: {e}") from None
    for number, row in enumerate(table.to_pylist(), start=1):
        yield f"{path}:row {number}", number, row


SPLIT_NAMES = ("train", "validation", "valid", "dev", "test")
"""Split names recognised in shard names when none is chosen."""


def _in_split(folder: Path, shards: list[Path], split: str) -> list[Path]:
    return [
        p for p in shards
        if p.stem == split or p.stem.startswith(f"{split}-") or split in p.relative_to(folder).parts[:-1]
    ]


def _folder_rows(folder: Path, split: str | None) -> Iterator[Row]:
    if (folder / "dataset_dict.json").is_file():  # save_to_disk of a DatasetDict: one folder per split
        splits = json.loads(_text(folder / "dataset_dict.json")).get("splits", [])
        if split is None or split not in splits:
            what = "choose one with task.options.split" if split is None else f"no split {split!r}"
            raise DataError(f"{folder} is a dataset with splits {splits}: {what}")
        yield from _folder_rows(folder / split, None)
        return
    if (folder / "state.json").is_file():  # save_to_disk of one Dataset
        if split is not None:
            raise DataError(f"{folder} is a single saved dataset without splits; drop task.options.split")
        state = json.loads(_text(folder / "state.json"))
        for entry in state.get("_data_files", []):
            yield from _arrow_rows(folder / entry["filename"])
        return
    shards = sorted(folder.rglob("*.parquet"))
    if split is None:
        found = [name for name in SPLIT_NAMES if _in_split(folder, shards, name)]
        if len(found) > 1:  # reading them all would mix, e.g., the test set into training
            raise DataError(f"{folder} holds the splits {found}: choose one with task.options.split")
    else:
        shards = _in_split(folder, shards, split)
    if not shards:
        which = f" for split {split!r}" if split is not None else ""
        raise DataError(
            f"{folder} holds no readable data{which}: expected *.parquet shards or a folder written by "
            "datasets.save_to_disk (state.json or dataset_dict.json)"
        )
    for shard in shards:
        yield from _parquet_rows(shard)
