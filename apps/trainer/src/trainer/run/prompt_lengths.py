"""Prompts longer than rollout.max_prompt_tokens, found when the task is loaded.

Drawn later, such a prompt would end the run at that step, and every resume at
the same step. They are dropped with a one-line count (`task.long_prompts=drop`,
the default) or reported as an error naming the first (`task.long_prompts=error`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from rl_core import Prompt, Tokenizer

from trainer.tasks import DataError, Task


def fit_prompts(
    task: Task, tokenizer: Tokenizer, *, max_prompt_tokens: int, on_long: str, log: Callable[[str], None]
) -> Task:
    """`task` without the prompts longer than `max_prompt_tokens` (BOS included), whose limit it then is."""
    kept: dict[str, tuple[Prompt, ...]] = {}
    dropped: dict[str, int] = {}
    for split in ("train", "heldout"):
        prompts: Sequence[Prompt] = getattr(task, split)
        fits = []
        for index, prompt in enumerate(prompts):
            length = len(tokenizer.encode(prompt.text, add_bos=True))
            if length <= max_prompt_tokens:
                fits.append(prompt)
            elif on_long == "error":
                where = f" (line {prompt.fields['line']} of the data file)" if "line" in prompt.fields else ""
                raise DataError(
                    f"task {task.name!r}: {split} prompt {index}{where} has {length} tokens, more than "
                    f"rollout.max_prompt_tokens={max_prompt_tokens}; raise the limit or set task.long_prompts=drop"
                )
        kept[split], dropped[split] = tuple(fits), len(prompts) - len(fits)
    if dropped["train"] or dropped["heldout"]:
        log(
            f"task {task.name}: dropped {dropped['train']} of {len(task.train)} training and "
            f"{dropped['heldout']} of {len(task.heldout)} held-out prompts longer than "
            f"rollout.max_prompt_tokens={max_prompt_tokens} (task.long_prompts=error stops instead)"
        )
    if not kept["train"]:
        raise DataError(
            f"task {task.name!r}: every training prompt is longer than rollout.max_prompt_tokens={max_prompt_tokens}"
        )
    if task.heldout and not kept["heldout"]:
        raise DataError(
            f"task {task.name!r}: every held-out prompt is longer than rollout.max_prompt_tokens={max_prompt_tokens}"
        )
    return dataclasses.replace(task, train=kept["train"], heldout=kept["heldout"], max_prompt_tokens=max_prompt_tokens)
