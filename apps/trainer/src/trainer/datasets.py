"""Tasks read from local files: GSM8K and MATH-style problems (JSONL or Parquet).

Rows are validated as they are read: a row that is not an object, lacks a
configured field, or whose reference answer cannot be scored is reported
with its file and line (row) number. Nothing is downloaded.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from rewards import RewardSpec, boxed_reward, gsm8k_reward
from rl_core.data import Prompt

from trainer.tasks import Task, split_heldout

GSM8K_INSTRUCTION = "Solve the problem step by step. End with a line '#### <answer>' giving the final number.\n\n"
MATH_INSTRUCTION = "Solve the problem step by step. Put the final answer in \\boxed{}.\n\n"


class DataError(ValueError):
    """A data file or one of its rows is malformed."""


def read_rows(path: str | Path) -> Iterator[tuple[int, Mapping[str, Any]]]:
    """(line or row number from 1, row) for a .jsonl or .parquet file."""
    path = Path(path)
    if not path.exists():
        raise DataError(f"data file {str(path)!r} does not exist")
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        try:
            table = pq.read_table(path)
        except Exception as e:  # noqa: BLE001 - pyarrow raises several kinds
            raise DataError(f"{path}: not a readable Parquet file: {e}") from None
        for number, row in enumerate(table.to_pylist(), start=1):
            yield number, row
        return
    if path.suffix not in (".jsonl", ".json"):
        raise DataError(f"{path}: unsupported data file type {path.suffix!r}; use .jsonl or .parquet")
    with path.open(encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(f"{path}:{number}: not valid JSON ({e.msg})") from None
            if not isinstance(row, dict):
                raise DataError(f"{path}:{number}: expected a JSON object, got {type(row).__name__}")
            yield number, row


def _field(path: str | Path, number: int, row: Mapping[str, Any], name: str) -> str:
    if name not in row:
        raise DataError(f"{path}:{number}: missing field {name!r} (fields present: {sorted(row)})")
    value = row[name]
    if not isinstance(value, (str, int, float)) or isinstance(value, bool) or str(value).strip() == "":
        raise DataError(f"{path}:{number}: field {name!r} must be a non-empty string or number, got {value!r}")
    return str(value)


def _load(
    data: str,
    *,
    question_field: str,
    answer_field: str,
    instruction: str,
    reward: RewardSpec,
) -> list[Prompt]:
    prompts = []
    for number, row in read_rows(data):
        question = _field(data, number, row, question_field)
        answer = _field(data, number, row, answer_field)
        # the reference must be scorable: its own text scored against itself gives 1
        try:
            ok = reward.fn([question], [answer], answer=[answer]) == [1.0]
        except ValueError:  # the reward could not read the reference
            ok = False
        if not ok:
            raise DataError(
                f"{data}:{number}: field {answer_field!r} has no final answer the {reward.name} reward can read: "
                f"{answer[:80]!r}"
            )
        prompts.append(Prompt(instruction + question, {"answer": answer, "line": number}))
    if not prompts:
        raise DataError(f"data file {data!r} holds no rows")
    return prompts


def _file_task(name: str, prompts: list[Prompt], reward: RewardSpec, heldout_size: int, seed: int, lengths: tuple[int, int]) -> Task:
    if not 0 <= heldout_size < len(prompts):
        raise DataError(f"heldout_size={heldout_size} leaves no training rows of {len(prompts)}")
    train, heldout = split_heldout(prompts, heldout_size, seed)
    return Task(
        name=name,
        description=f"{len(prompts)} problems from a local file",
        train=tuple(train),
        heldout=tuple(heldout),
        rewards=(reward,),
        correct=reward.name,
        teacher=lambda p, rng: p.fields["answer"],
        max_prompt_tokens=lengths[0],
        max_new_tokens=lengths[1],
        chat=True,
    )


@dataclasses.dataclass(frozen=True)
class FileTaskKind:
    """What distinguishes one file-backed task from another."""

    reward: RewardSpec
    instruction: str
    question_field: str
    answer_field: str
    max_prompt_tokens: int
    max_new_tokens: int


FILE_TASKS = {
    "gsm8k": FileTaskKind(RewardSpec(gsm8k_reward), GSM8K_INSTRUCTION, "question", "answer", 256, 512),
    "math": FileTaskKind(RewardSpec(boxed_reward), MATH_INSTRUCTION, "problem", "solution", 384, 1024),
}


def file_task(
    name: str,
    *,
    data: str,
    question_field: str | None = None,
    answer_field: str | None = None,
    heldout_size: int = 200,
    seed: int = 0,
    max_prompt_tokens: int | None = None,
    max_new_tokens: int | None = None,
) -> Task:
    """A task of kind `name` ("gsm8k": '#### n' answers; "math": the last \\boxed{}) from `data`.

    Fields and lengths default to the kind's (GSM8K: question/answer, 256/512 tokens;
    MATH: problem/solution, 384/1024 tokens).
    """
    kind = FILE_TASKS[name]
    prompts = _load(
        data,
        question_field=question_field or kind.question_field,
        answer_field=answer_field or kind.answer_field,
        instruction=kind.instruction,
        reward=kind.reward,
    )
    lengths = (max_prompt_tokens or kind.max_prompt_tokens, max_new_tokens or kind.max_new_tokens)
    return _file_task(name, prompts, kind.reward, heldout_size, seed, lengths)


def gsm8k(**options: Any) -> Task:
    """GSM8K-style JSONL/Parquet rows (question, answer with '#### n'), chat-templated."""
    return file_task("gsm8k", **options)


def math(**options: Any) -> Task:
    """MATH-style JSONL/Parquet rows (problem, solution with \\boxed{}), chat-templated."""
    return file_task("math", **options)
