"""reasoning-gym's procedural datasets as a task: any of its datasets by name, scored by its own verifier.

    trainer train --algo grpo --task reasoning_gym task.options.dataset=basic_arithmetic

reasoning-gym (PyPI; offline) generates questions with their answers from a seed and checks an
answer with the dataset's `score_answer`. Each row's prompt is the question (with the task's
system prompt, chat-templated where the tokenizer has a template); the reward
`reasoning_gym` passes the completion's answer (the content of its last `<answer_tag>` pair, or
the whole completion without a tag) to the verifier of the row's dataset. Install the extra:
`uv pip install 'trainer[reasoning-gym]'` (the workspace's dev group has it).
"""

from __future__ import annotations

import importlib.util
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from rewards import RewardSpec
from rewards.formatting import tag_content
from rl_core import Prompt

from trainer.tasks.rows import RowPrompt
from trainer.tasks.task import Task, check_heldout, split_heldout

__all__ = ["reasoning_gym", "reasoning_gym_reward"]


def _library() -> Any:
    if importlib.util.find_spec("reasoning_gym") is None:
        raise ValueError("task reasoning_gym needs the reasoning-gym package: uv pip install 'trainer[reasoning-gym]'")
    # its dependency cellpylib compares with `is "recursive"`: Python warns when it compiles those
    # files (the first import after an install), which a user of the task cannot act on
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message='"is" with a literal', category=SyntaxWarning)
        import reasoning_gym as library  # optional: imported where it is used

    return library


def reasoning_gym_reward(answer_tag: str | None = None):
    """The dataset's own verifier on each completion's answer: ``fn(completions, answer, metadata, question)``."""
    library = _library()

    def reasoning_gym(prompts: Sequence[str], completions: Sequence[str], *, answer: Sequence[object],
                      metadata: Sequence[Mapping[str, Any]], question: Sequence[str], **_: object) -> list[float]:
        scores = []
        for completion, reference, meta, text in zip(completions, answer, metadata, question, strict=True):
            given = tag_content(completion, answer_tag) if answer_tag else completion
            if given is None:
                scores.append(0.0)
                continue
            score = library.get_score_answer_fn(meta["source_dataset"])
            entry = {"question": text, "answer": reference, "metadata": dict(meta)}
            scores.append(float(score(answer=given.strip(), entry=entry)))
        return scores

    return reasoning_gym


def reasoning_gym(
    *,
    dataset: str = "basic_arithmetic",
    size: int = 2000,
    seed: int = 0,
    config: dict | None = None,
    heldout_size: int = 200,
    system_prompt: str | None = None,
    answer_tag: str | None = None,
    chat: bool | None = None,
    template_options: dict | None = None,
    max_prompt_tokens: int = 256,
    max_new_tokens: int = 32,
) -> Task:
    """`size` questions of reasoning-gym's `dataset` (with its `config`, e.g. {min_terms: 2, max_terms: 2})
    from `seed`, scored by the dataset's verifier; the warm start imitates its answers (inside
    `<answer_tag>` when one is set)."""
    library = _library()
    try:
        generated = library.create_dataset(dataset, size=size, seed=seed, **(config or {}))
    except (KeyError, ValueError, TypeError) as e:
        known = sorted(library.factory.DATASETS)
        raise ValueError(f"dataset = {dataset!r} with config {config or {}}: {e} (datasets: {', '.join(known[:12])}, ... "
                         f"{len(known)} in all)") from None
    check_heldout(heldout_size, size)
    rows = []
    for entry in generated:
        messages = ({"role": "system", "content": system_prompt},) if system_prompt else ()
        messages += ({"role": "user", "content": entry["question"]},)
        text = "\n\n".join(m["content"] for m in messages)
        fields = {"answer": str(entry["answer"]), "question": entry["question"], "metadata": dict(entry["metadata"]),
                  "data_source": dataset}
        rows.append(RowPrompt(text, fields, messages))
    train, heldout = split_heldout(rows, heldout_size, seed)

    def teacher(prompt: Prompt, rng: np.random.Generator) -> str:
        reference = prompt.fields["answer"]
        return f"<{answer_tag}>{reference}</{answer_tag}>" if answer_tag else reference

    return Task(
        name="reasoning_gym",
        description=f"{size} questions of reasoning-gym's {dataset}, scored by its verifier",
        train=tuple(train),
        heldout=tuple(heldout),
        rewards=(RewardSpec(reasoning_gym_reward(answer_tag)),),
        correct="reasoning_gym",
        teacher=teacher,
        max_prompt_tokens=max_prompt_tokens,
        max_new_tokens=max_new_tokens,
        chat=chat,
        template_options=dict(template_options or {}),
    )
