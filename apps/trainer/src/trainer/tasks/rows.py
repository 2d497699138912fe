"""One row model for the dataset shapes users have, read by one reader (`trainer.tasks.data_files`).

A row's prompt is text or messages; every other column reaches the reward functions by name
(nested ones as their dicts). The shapes, in the order they are recognised:

- TRL standard: ``{"prompt": "text", ...}``;
- TRL conversational and verl: ``{"prompt": [{"role": ..., "content": ...}, ...], ...}``; verl's
  rows add ``data_source``, ``ability``, ``reward_model: {"ground_truth": ...}`` and ``extra_info``;
- conversations: ``{"messages": [..., {"role": "assistant", "content": REF}]}``: the final
  assistant turn is the reference (column ``answer``) and is not shown;
- GSM8K: ``{"question": ..., "answer": ...}``; MATH: ``{"problem": ..., "solution": ...}``.

The reference answer is column ``answer`` (what the built-in rewards read): when a row has no
``answer`` column it is taken from ``reward_model.ground_truth``, ``solution`` or the final
assistant turn, in that order.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

from rewards.manager import ROW_FIELD
from rl_core import Prompt

from trainer.tasks.data_files import DataError, Row

__all__ = ["PROMPT_COLUMNS", "RESERVED", "DataRow", "RowPrompt", "data_row", "plain_text", "prompts_of"]

PROMPT_COLUMNS = ("prompt", "messages", "question", "problem")
"""The columns a prompt is read from, in this order."""
ROLES = ("system", "user", "assistant", "tool")
RESERVED = ("prompts", "completions", "completion_ids", "completion_lengths", "step", ROW_FIELD)
"""Names the reward call itself uses: no column may take them."""


@dataclasses.dataclass(frozen=True)
class RowPrompt(Prompt):
    """A prompt read from a data row: `text` is what the model sees (a plain rendering until the chat
    template renders `messages`), `fields` every column but the prompt."""

    messages: tuple[Mapping[str, str], ...] = ()
    """The prompt as messages (a text prompt is one user message), the system prompt included."""


@dataclasses.dataclass(frozen=True)
class DataRow:
    where: str
    messages: tuple[Mapping[str, str], ...]
    """The prompt as messages (a text prompt as one user message)."""
    columns: dict[str, Any]
    """Every column but the prompt, plus ``answer`` (the reference) when it can be found."""


def _messages(where: str, column: str, value: Any) -> tuple[dict[str, str], ...]:
    if not isinstance(value, (list, tuple)) or not value:
        raise DataError(f"{where}: column {column!r} must be text or a non-empty list of messages, got {value!r:.80}")
    out = []
    for i, message in enumerate(value):
        if not isinstance(message, Mapping) or not isinstance(message.get("content"), str) \
                or message.get("role") not in ROLES:
            raise DataError(f"{where}: {column}[{i}] must be {{role: one of {', '.join(ROLES)}, content: text}}, "
                            f"got {message!r:.80}")
        out.append({"role": message["role"], "content": message["content"]})
    return tuple(out)


def _text(where: str, column: str, value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int, float)) or str(value).strip() == "":
        raise DataError(f"{where}: column {column!r} must be a non-empty string, got {value!r:.80}")
    return str(value)


def data_row(where: str, row: Mapping[str, Any]) -> DataRow:
    """The row model of `row` (read at `where`); a row in none of the shapes raises naming what it has."""
    column = next((c for c in PROMPT_COLUMNS if c in row), None)
    if column is None:
        raise DataError(
            f"{where}: no prompt column (one of {', '.join(PROMPT_COLUMNS)}); the row has {sorted(row)}. "
            "See docs/bring-your-own-task.md for the shapes read"
        )
    columns = {k: v for k, v in row.items() if k != column}
    value = row[column]
    if isinstance(value, str) or column in ("question", "problem"):
        messages = ({"role": "user", "content": _text(where, column, value)},)
    else:
        messages = _messages(where, column, value)
        if column == "messages":
            if messages[-1]["role"] != "assistant" or len(messages) < 2:
                raise DataError(f"{where}: column 'messages' must end with the assistant's reference turn "
                                f"after the prompt; its roles are {[m['role'] for m in messages]}")
            columns.setdefault("answer", messages[-1]["content"])
            messages = messages[:-1]
        elif messages[-1]["role"] == "assistant":
            raise DataError(f"{where}: column 'prompt' ends with an assistant turn; the model answers after the "
                            "prompt (a reference goes in 'messages' or a column such as 'solution')")
    for name in columns:
        if not isinstance(name, str) or not name.isidentifier() or name in RESERVED:
            why = "the reward call's own argument" if name in RESERVED else "not a Python name"
            raise DataError(f"{where}: column {name!r} cannot reach the rewards by name ({why}); rename it")
    if "answer" not in columns:
        ground = columns.get("reward_model")
        if isinstance(ground, Mapping) and ground.get("ground_truth") is not None:
            columns["answer"] = ground["ground_truth"]
        elif columns.get("solution") is not None:
            columns["answer"] = columns["solution"]
    return DataRow(where, messages, columns)


def plain_text(messages: Iterable[Mapping[str, str]]) -> str:
    """Messages as plain text for a model without a chat template: their contents, a blank line apart."""
    return "\n\n".join(m["content"] for m in messages)


def prompts_of(rows: Iterable[Row], system_prompt: str | None = None) -> list[RowPrompt]:
    """The RowPrompts of rows as `read_rows` yields them; `system_prompt` goes first where a row has none."""
    out = []
    for where, _number, raw in rows:
        row = data_row(where, raw)
        messages = row.messages
        if system_prompt and messages[0]["role"] != "system":
            messages = ({"role": "system", "content": system_prompt}, *messages)
        out.append(RowPrompt(plain_text(messages), {**row.columns, ROW_FIELD: where}, messages))
    return out
