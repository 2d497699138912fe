"""A judge the project trains itself on CPU: a fresh preset warm-started on a task's judge examples.

For a task that brings `judge_examples` (e.g. number_words), `judge.train_steps` > 0 makes the
judge a `judge.preset` model with the character tokenizer, taught by the supervised warm start
(trainer.warmstart) to reply `judge.yes_word` or `judge.no_word` to each example's judge prompt
(`judge.template`). It is cached in the run's cache folder keyed by everything it depends on,
like the base policy, so a second run (or every variant of a comparison) loads it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path

import jax
import numpy as np
import orbax.checkpoint as ocp
from flax import nnx
from rl_core import ConfigError, Prompt
from rl_models import CharTokenizer, Transformer, preset

from trainer.settings.judge import JudgeSettings
from trainer.settings.judge_template import JudgeTemplate
from trainer.tasks import Task
from trainer.warmstart import warm_start

EXAMPLES = 4096
"""Judge prompts the warm start draws its batches from."""
BATCH, LEARNING_RATE, SEED = 64, 3e-3, 0


def judge_task(task: Task, judge: JudgeSettings, rng: np.random.Generator, count: int) -> Task:
    """The judge's supervised task: each example's judge prompt, and its verdict word as the target."""
    if task.judge_examples is None:
        raise ConfigError(f"judge.train_steps = {judge.train_steps}: task {task.name!r} brings no judge examples "
                          "to train a judge on; name a judge with judge.path or judge.run")
    template = JudgeTemplate(judge.template)
    prompts = tuple(
        Prompt(text, {"verdict": judge.yes_word if correct else judge.no_word, "correct": correct})
        for (prompt, completion, reference, correct) in task.judge_examples(rng, count)
        for text in template.render([prompt], [completion], [reference])
    )
    return Task(name=f"{task.name}-judge", description=f"the judge of {task.name}", train=prompts, heldout=prompts[:1],
                rewards=(), correct="", teacher=lambda p, rng: p.fields["verdict"],
                max_prompt_tokens=judge.max_prompt_tokens, max_new_tokens=judge.max_new_tokens)


def cache_key(task: Task, judge: JudgeSettings, task_settings: dict) -> str:
    """What the trained judge depends on: the task, the judge's model and its targets."""
    relevant = {"task": task_settings, "preset": judge.preset, "steps": judge.train_steps, "template": judge.template,
                "yes": judge.yes_word, "no": judge.no_word, "max_prompt_tokens": judge.max_prompt_tokens,
                "max_new_tokens": judge.max_new_tokens, "examples": EXAMPLES, "platform": jax.default_backend()}
    return hashlib.sha256(json.dumps(relevant, sort_keys=True).encode()).hexdigest()[:12]


def trained_judge(judge: JudgeSettings, task: Task, task_settings: dict, *, cache_dir: Path | None,
                  log: Callable[[str], None]) -> tuple[Transformer, CharTokenizer]:
    """(the judge model, its tokenizer), warm-started now or loaded from `cache_dir`."""
    tokenizer = CharTokenizer()
    module = Transformer(preset(judge.preset, vocab_size=tokenizer.vocab_size), rngs=nnx.Rngs(SEED))
    path = cache_dir / f"judge-{cache_key(task, judge, task_settings)}" if cache_dir is not None else None
    if path is not None and path.exists():
        state = ocp.StandardCheckpointer().restore(path.absolute(),
                                                   jax.tree.map(ocp.utils.to_shape_dtype_struct, nnx.state(module)))
        nnx.update(module, state)
        log(f"judge: trained judge cached at {path}")
        return module, tokenizer
    examples = judge_task(task, judge, np.random.default_rng(SEED), EXAMPLES)
    log(f"judge: warm-starting a {judge.preset} judge for {judge.train_steps} steps on {EXAMPLES} examples of {task.name}")
    warm_start(module, examples, tokenizer, steps=judge.train_steps, batch_size=BATCH, learning_rate=LEARNING_RATE,
               seed=SEED, log=log)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        checkpointer = ocp.StandardCheckpointer()
        checkpointer.save(path.absolute(), nnx.state(module))  # written aside and renamed: complete or absent
        checkpointer.wait_until_finished()
    return module, tokenizer


def heldout_examples(task: Task, judge: JudgeSettings, count: int = 256) -> Task:
    """Fresh examples (another seed) to measure the trained judge's agreement with the task's answers."""
    return judge_task(task, judge, np.random.default_rng(SEED + 1), count)


__all__ = ["EXAMPLES", "cache_key", "heldout_examples", "judge_task", "trained_judge"]
