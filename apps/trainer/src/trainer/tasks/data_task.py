"""The `data` task: any file (or user code) of rows in the shapes of `trainer.tasks.rows`.

    trainer train --algo grpo --data rows.jsonl                 # the reward from the references
    trainer train --algo grpo --data rows.parquet task.options.reward=my_rewards.py:exact

The task's own reward (its correctness reward) is `reward` when given (a registered name,
`module:function` or `path/to/file.py:function`); otherwise it is chosen from the rows'
reference answers (column `answer`, see `trainer.tasks.rows`): `gsm8k` when every one holds
'#### n', `numeric_answer` when every one is a number, `boxed` otherwise. Rows without
references need a reward: `reward`, or entries of the run's `rewards:` section.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

import numpy as np
from rewards import RewardSpec, make_reward
from rewards.code import CodeError, is_code_reference, load_object
from rewards.manager import ROW_FIELD
from rewards.numbers import reference_number
from rl_core import Prompt

from trainer.tasks.data_files import DataError, Row, read_rows
from trainer.tasks.rows import RowPrompt, plain_text, prompts_of
from trainer.tasks.task import Task, heldout_file, split_heldout

__all__ = ["EVAL_TASK_OPTIONS", "data", "evaluation_set", "rows_of", "sft_set"]

DEFAULT_TOKENS = 256
"""The lengths of a run with a model folder (whose tokenizer counts the rows' tokens) when the options set none."""

EVAL_TASK_OPTIONS = ("system_prompt", "chat", "template_options", "reward")
"""A data task's options an evaluation file inherits from the run (the rows' rendering and reward)."""


def rows_of(source: str, split: str | None = None) -> Iterable[Row]:
    """The rows of a data path, or of user code (`module:function`, `file.py:function`) that returns them."""
    if Path(source).exists() or not is_code_reference(source):
        yield from read_rows(source, split)
        return
    try:
        make = load_object(source, "task.options.data")
    except CodeError as e:
        raise DataError(str(e)) from None
    rows = make(split=split) if split is not None else make()
    for number, row in enumerate(rows, start=1):
        where = f"{source} row {number}"
        if not isinstance(row, Mapping):
            raise DataError(f"{where}: expected a mapping of columns, got {type(row).__name__}")
        yield where, number, row


def _is_number(value: object) -> bool:
    try:
        reference_number(value, "answer", 0)
    except ValueError:
        return False
    return True


def _auto_reward(references: list[object]) -> str:
    if all(isinstance(r, str) and "####" in r for r in references):
        return "gsm8k"
    if all(_is_number(r) for r in references):
        return "numeric_answer"
    return "boxed"


def _teacher_text(reward: str, reference: object) -> str:
    """A completion the automatic reward accepts for `reference` (the warm start imitates it)."""
    text = str(reference)
    if reward == "boxed" and "\\boxed" not in text:
        return f"\\boxed{{{text}}}"
    return text


def _rewards(prompts: list[Prompt], reward: str | None) -> tuple[tuple[RewardSpec, ...], str | None]:
    """(the task's own reward, its name): `reward`, else the automatic one when every row has a reference."""
    if reward is not None:
        try:
            name = reward.split(":")[-1] if is_code_reference(reward) else reward
            return (RewardSpec(make_reward(reward), name=name),), reward
        except CodeError as e:
            raise ValueError(f"reward = {e}") from None
    references = [p.fields.get("answer") for p in prompts]
    if all(r is not None for r in references):
        chosen = _auto_reward(references)
        return (RewardSpec(make_reward(chosen)),), chosen
    return (), None  # the run's rewards: entries score it (checked with the settings)


def evaluation_set(
    data: str,
    *,
    reward: str | None = None,
    system_prompt: str | None = None,
    chat: bool | None = None,
    template_options: dict | None = None,
    max_prompt_tokens: int = 256,
    max_new_tokens: int = 256,
    split: str | None = None,
) -> Task:
    """Every row of `data` as held-out prompts (no training rows), scored by `reward` (default: chosen
    from the references as for `data`); a benchmark file for `trainer eval --data` and `eval.sets`."""
    prompts = prompts_of(rows_of(data, split), system_prompt)
    if not prompts:
        raise DataError(f"data {data!r} holds no rows")
    specs, _ = _rewards(prompts, reward)
    if not specs:
        raise DataError(f"the rows of {data!r} carry no reference answer: name the reward that scores them")
    return Task(name="data", description=f"{len(prompts)} rows from {data}", train=(), heldout=tuple(prompts),
                rewards=specs, correct=specs[0].name, teacher=_no_teacher, max_prompt_tokens=max_prompt_tokens,
                max_new_tokens=max_new_tokens, chat=chat, template_options=dict(template_options or {}))


def sft_set(
    data: str,
    *,
    system_prompt: str | None = None,
    chat: bool | None = None,
    template_options: dict | None = None,
    max_prompt_tokens: int = 256,
    max_new_tokens: int = 256,
) -> Task:
    """Every row of `data` as supervised examples (`train`): the prompt, and the reference (a
    conversation's final assistant turn, `solution`, `reward_model.ground_truth`, `answer`) as the
    target the warm start imitates, as it is. A conversation with earlier assistant turns is trained
    on each of them: its prompt ends before the first, and field `turns` holds the rest (the
    assistant's turns trained, the others not; `trainer.build.warm_start_task` renders them)."""
    prompts = prompts_of(rows_of(data), system_prompt)
    missing = next((p for p in prompts if p.fields.get("answer") is None), None)
    if missing is not None:
        raise DataError(f"{missing.fields['source_row']}: a supervised row needs a reference to imitate (a final "
                        "assistant turn, or a column answer, solution or reward_model.ground_truth)")
    if not prompts:
        raise DataError(f"data {data!r} holds no rows")
    prompts = [_from_first_reply(p) for p in prompts]
    # plain text: each later turn after a blank line (trainer.build.turn_segments), the final reply as it is
    targets = [sum(len(t["content"]) + 2 for t in p.fields.get("turns", ())) or len(str(p.fields["answer"]))
               for p in prompts]
    return Task(name="sft", description=f"{len(prompts)} supervised rows from {data}", train=tuple(prompts),
                row_lengths=(max(len(p.text) for p in prompts) + 1, _with_slack(max(targets))),
                heldout=(), rewards=(), correct="", teacher=_reference, max_prompt_tokens=max_prompt_tokens,
                max_new_tokens=max_new_tokens, chat=chat, template_options=dict(template_options or {}))


def _from_first_reply(prompt: RowPrompt) -> RowPrompt:
    """`prompt` cut before its first assistant turn, the turns from there (the reference last) in `turns`."""
    first = next((i for i, m in enumerate(prompt.messages) if m["role"] == "assistant"), None)
    if first is None:
        return prompt
    head = prompt.messages[:first]
    turns = (*prompt.messages[first:], {"role": "assistant", "content": str(prompt.fields["answer"])})
    return RowPrompt(plain_text(head), {**prompt.fields, "turns": turns}, head)


def _reference(prompt: Prompt, rng: np.random.Generator) -> str:
    return str(prompt.fields["answer"])


def _no_teacher(prompt: Prompt, rng: np.random.Generator) -> str:
    raise DataError("an evaluation set has no warm start")


def data(
    *,
    data: str,
    split: str | None = None,
    heldout_data: str | None = None,
    reward: str | None = None,
    system_prompt: str | None = None,
    chat: bool | None = None,
    template_options: dict | None = None,
    heldout_size: int | None = None,
    seed: int = 0,
    max_prompt_tokens: int | None = None,
    max_new_tokens: int | None = None,
) -> Task:
    """Rows of `data` (a JSONL, JSON, Parquet file, a folder, or `module:function` / `file.py:function`
    returning rows) in any shape of `trainer.tasks.rows`.

    `reward`: the task's correctness reward (default: chosen from the references). `system_prompt`:
    the system message of rows without one. `chat`: render prompts with the tokenizer's chat template
    (true), as plain text (false), or the template when the tokenizer has one (null). `template_options`:
    variables for the chat template, e.g. {enable_thinking: false}. `heldout_size`: rows kept out of
    training for evaluation (default a tenth, at most 200). `heldout_data`: a held-out file of its own
    (any kind `data` may be): then every row of `data` trains, and at most `heldout_size` (default 200)
    of its rows, drawn by `seed`, are the held-out set. `max_prompt_tokens`, `max_new_tokens`: the
    lengths; None: from the rows when the run has no model folder (`row_lengths`), else DEFAULT_TOKENS.
    """
    if template_options is not None and not isinstance(template_options, Mapping):
        raise ValueError(f"template_options = {template_options!r}: must be a mapping, e.g. {{enable_thinking: false}}")
    if system_prompt is not None and not isinstance(system_prompt, str):
        raise ValueError(f"system_prompt = {system_prompt!r}: must be text")
    prompts = prompts_of(rows_of(data, split), system_prompt)
    if heldout_data is not None:
        own = heldout_file(heldout_data, data, lambda path: prompts_of(rows_of(path), system_prompt))
        size = min(200, len(own)) if heldout_size is None else heldout_size
        if size < 1:
            raise ValueError(f"heldout_size = {size!r}: must be >= 1")
        train, heldout = prompts, own if len(own) <= size else split_heldout(own, size, seed)[1]
        if not train:
            raise DataError(f"data {data!r} holds no rows")
        if reward is None and all(p.fields.get("answer") is not None for p in train):
            bare = next((p for p in heldout if p.fields.get("answer") is None), None)
            if bare is not None:  # the automatic reward, chosen from the references, could not score it
                raise ValueError(f"heldout_data = {heldout_data!r}: {bare.fields[ROW_FIELD]} has no reference answer, "
                                 "as every training row has; add one, or name the reward (task.options.reward)")
        specs, chosen = _rewards(train + heldout, reward)
    else:
        if len(prompts) < 2:
            raise DataError(f"data {data!r} holds {len(prompts)} rows: at least 2 are needed (training and held-out)")
        size = max(1, min(200, len(prompts) // 10)) if heldout_size is None else heldout_size
        if not 1 <= size < len(prompts):
            rule = "must be >= 1" if size < 1 else f"must be less than the {len(prompts)} rows (it leaves no training rows)"
            raise ValueError(f"heldout_size = {size!r}: {rule}")
        specs, chosen = _rewards(prompts, reward)
        train, heldout = split_heldout(prompts, size, seed)

    def teacher(prompt: Prompt, rng: np.random.Generator) -> str:
        if prompt.fields.get("answer") is None:
            raise DataError(f"{prompt.fields.get('source_row')}: the warm start imitates reference answers, and this "
                            "row has none; set warm_start.steps=0")
        return _teacher_text(chosen, prompt.fields["answer"])

    return Task(
        name="data",
        description=f"{len(prompts)} rows from {data}",
        train=tuple(train),
        heldout=tuple(heldout),
        rewards=specs,
        correct=specs[0].name if specs else "",
        teacher=teacher,
        max_prompt_tokens=DEFAULT_TOKENS if max_prompt_tokens is None else max_prompt_tokens,
        max_new_tokens=DEFAULT_TOKENS if max_new_tokens is None else max_new_tokens,
        chat=chat,
        template_options=dict(template_options or {}),
        warm_start_share=0.5,
        # held-out rows count too: a held-out file's prompts may be longer than the training rows'
        row_lengths=(None if max_prompt_tokens is not None else max(len(p.text) for p in [*train, *heldout]) + 1,
                     None if max_new_tokens is not None else completion_tokens([*train, *heldout], chosen)),
    )


def completion_tokens(prompts: list[RowPrompt], reward: str | None) -> int | None:
    """Completion tokens the rows need under the character tokenizer: the longest completion the warm start
    imitates, its EOS, and a quarter more (at least 2) for the policy's own variations; None without references."""
    references = [p.fields.get("answer") for p in prompts]
    if any(r is None for r in references):
        return None
    return _with_slack(max(len(_teacher_text(reward, r)) for r in references))


def _with_slack(characters: int) -> int:
    """Tokens for a completion of `characters` characters: its EOS, and a quarter more (at least 2)."""
    return characters + 1 + max(2, characters // 4)

