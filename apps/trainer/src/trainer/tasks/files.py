"""Tasks read from local data: GSM8K and MATH-style problems (see `trainer.tasks.data_files` for the formats).

Rows are validated as they are read: a row that is not an object, lacks a
configured field, or whose reference answer cannot be scored is reported
with its file and line (row) number. Nothing is downloaded.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Mapping
from typing import Any

from rewards import RewardSpec, boxed_reward, gsm8k_reward
from rl_core import Prompt

from trainer.tasks.data_files import DataError, read_rows
from trainer.tasks.rows import RowPrompt, plain_text
from trainer.tasks.task import Task, heldout_file, split_heldout

__all__ = ["FILE_TASKS", "FileTask", "FileTaskKind", "file_task", "gsm8k", "math"]

GSM8K_INSTRUCTION = "Solve the problem step by step. End with a line '#### <answer>' giving the final number.\n\n"
MATH_INSTRUCTION = "Solve the problem step by step. Put the final answer in \\boxed{}.\n\n"


def _field(where: str, row: Mapping[str, Any], name: str) -> str:
    if name not in row:
        raise DataError(f"{where}: missing field {name!r} (fields present: {sorted(row)})")
    value = row[name]
    if not isinstance(value, (str, int, float)) or isinstance(value, bool) or str(value).strip() == "":
        raise DataError(f"{where}: field {name!r} must be a non-empty string or number, got {value!r}")
    return str(value)


def _load(
    data: str,
    *,
    question_field: str,
    answer_field: str,
    instruction: str,
    reward: RewardSpec,
    split: str | None = None,
    system_prompt: str | None = None,
) -> list[Prompt]:
    prompts = []
    for where, number, row in read_rows(data, split):
        question = _field(where, row, question_field)
        answer = _field(where, row, answer_field)
        # the reference must be scorable: its own text scored against itself gives 1
        try:
            ok = reward.fn([question], [answer], answer=[answer]) == [1.0]
        except ValueError:  # the reward could not read the reference
            ok = False
        if not ok:
            raise DataError(
                f"{where}: field {answer_field!r} has no final answer the {reward.name} reward can read: "
                f"{answer[:80]!r}"
            )
        messages = ({"role": "system", "content": system_prompt},) if system_prompt else ()
        messages += ({"role": "user", "content": instruction + question},)
        prompts.append(RowPrompt(plain_text(messages), {"answer": answer, "line": number}, messages))
    if not prompts:
        raise DataError(f"data path {data!r} holds no rows")
    return prompts


def _file_task(name: str, prompts: list[Prompt], reward: RewardSpec, heldout_size: int, seed: int, lengths: tuple[int, int],
               template_options: dict, heldout_prompts: list[Prompt] | None = None) -> Task:
    if heldout_size < 1:
        raise DataError(f"task.options.heldout_size = {heldout_size!r}: must be >= 1")
    if heldout_prompts is not None:  # a file of its own: every data row trains; at most heldout_size of its rows
        train = prompts
        heldout = heldout_prompts if len(heldout_prompts) <= heldout_size else (
            split_heldout(heldout_prompts, heldout_size, seed)[1])
    elif heldout_size >= len(prompts):
        raise DataError(f"task.options.heldout_size = {heldout_size!r}: must be less than the {len(prompts)} rows of "
                        "the data (it leaves no training rows); or give a held-out file (task.options.heldout_data)")
    else:
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
        template_options=template_options,
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
    split: str | None = None,
    heldout_data: str | None = None,
    heldout_size: int = 200,
    seed: int = 0,
    max_prompt_tokens: int | None = None,
    max_new_tokens: int | None = None,
    system_prompt: str | None = None,
    template_options: dict | None = None,
) -> Task:
    """A task of kind `name` ("gsm8k": '#### n' answers; "math": the last \\boxed{}) from `data`.

    `data` is a JSONL, JSON-array or Parquet file, a folder of Parquet shards or a
    `datasets.save_to_disk` folder; `split` picks a split of a folder (e.g. "test"). `heldout_data`
    (any of those) is a held-out set of its own: then every row of `data` trains, and at most
    `heldout_size` rows of it (drawn by `seed`) are held out; without it, `heldout_size` rows of
    `data` are.
    Fields and lengths default to the kind's (GSM8K: question/answer, 256/512 tokens;
    MATH: problem/solution, 384/1024 tokens). `system_prompt`: a system message before each problem;
    `template_options`: variables for the chat template (e.g. {enable_thinking: false}).
    """
    kind = FILE_TASKS[name]

    def rows(path: str, split: str | None) -> list[Prompt]:
        return _load(path, question_field=question_field or kind.question_field,
                     answer_field=answer_field or kind.answer_field, instruction=kind.instruction, reward=kind.reward,
                     split=split, system_prompt=system_prompt)

    prompts = rows(data, split)
    heldout = heldout_file(heldout_data, data, lambda path: rows(path, None)) if heldout_data is not None else None
    lengths = (max_prompt_tokens or kind.max_prompt_tokens, max_new_tokens or kind.max_new_tokens)
    return _file_task(name, prompts, kind.reward, heldout_size, seed, lengths, dict(template_options or {}), heldout)


class FileTask:
    """A file-backed task of one kind, as an entry point of ``trainer.tasks`` points at: called with the
    task's options (``data`` required), it reads the rows. Its signature is `file_task`'s with the kind's
    fields and lengths as defaults (what ``trainer tasks --options`` shows)."""

    def __init__(self, name: str, doc: str) -> None:
        self.name = name
        self.__doc__ = doc
        kind = FILE_TASKS[name]
        defaults = {f: getattr(kind, f) for f in ("question_field", "answer_field", "max_prompt_tokens", "max_new_tokens")}
        parameters = [p.replace(default=defaults.get(p.name, p.default))
                      for p in inspect.signature(file_task).parameters.values() if p.kind is p.KEYWORD_ONLY]
        self.__signature__ = inspect.Signature(parameters, return_annotation=Task)

    def __call__(self, **options: Any) -> Task:
        return file_task(self.name, **options)

    def __repr__(self) -> str:
        return f"FileTask({self.name!r})"


gsm8k = FileTask("gsm8k", "GSM8K-style JSONL/Parquet rows (question, answer with '#### n'), chat-templated.")
math = FileTask("math", "MATH-style JSONL/Parquet rows (problem, solution with \\boxed{}), chat-templated.")
