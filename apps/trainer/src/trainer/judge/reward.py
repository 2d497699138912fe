"""The judge's reward function, and how a run builds it from its judge entries (`rewards:` entries of kind judge
and the `judge:` section, trainer.settings.reward_functions.model_judges).

The reward manager calls it like any reward, `fn(prompts, completions, **fields)`; it renders
one judge prompt per completion, sends them all through the judge in one call (greedy replies
read by a rewards.verdicts rule, or the yes/no probability), and returns `Scores` whose metrics
give the judge's wall time (`time/<name>`, part of `time/reward`), the replies without a
verdict (`rewards/<name>/unparsed`) and the judge prompts longer than judge.max_prompt_tokens
(`rewards/<name>/too_long`, not sent to the judge); both are scored `unparsed_score`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
from rewards import RewardSpec, Scores
from rewards.verdicts import yes_probability
from rl_core import ConfigError
from rl_models import PAGED_TRANSFORMER
from rl_models.hf import load_hf_model, load_hf_tokenizer

from trainer import build
from trainer.judge.model import JudgeModel
from trainer.settings.judge import YES_PROBABILITY, JudgeSettings
from trainer.settings.judge_template import JudgeTemplate, verdict_scores
from trainer.judge.trained import heldout_examples, trained_judge
from trainer.run import load_run_policy
from trainer.settings import RunSettings
from trainer.settings.reward_functions import model_judges
from trainer.tasks import Task


class JudgeReward:
    """`fn(prompts, completions, **fields) -> Scores`: the judge's score of each completion, in [0, 1]."""

    def __init__(self, judge: JudgeModel, settings: JudgeSettings) -> None:
        self.judge = judge
        self.settings = settings
        self.template = JudgeTemplate(settings.template)
        self.rule = settings.rule()
        self.__name__ = settings.name

    def __call__(self, prompts: Sequence[str], completions: Sequence[str], **fields: Sequence[object]) -> Scores:
        s = self.settings
        start = time.perf_counter()
        references = None
        if self.template.needs_reference:
            if s.reference_field not in fields:
                known = sorted(k for k in fields if not k.startswith("completion"))
                raise ValueError(f"the judge template uses {{reference}}, judge.reference_field = {s.reference_field!r}, "
                                 f"but the task's prompts have no such field (they have {known})")
            references = fields[s.reference_field]
        texts = self.template.render(prompts, completions, references)
        fits = self.judge.fits(texts)
        scores = [s.unparsed_score] * len(texts)  # a judge prompt too long for the judge is not judged
        judged = [i for i, ok in enumerate(fits) if ok]
        unparsed = 0
        if judged:
            some, unparsed = self.verdicts([texts[i] for i in judged])
            for i, score in zip(judged, some, strict=True):
                scores[i] = score
        seconds = time.perf_counter() - start
        return Scores(scores, {f"time/{s.name}": seconds, f"rewards/{s.name}/unparsed": float(unparsed),
                               f"rewards/{s.name}/too_long": float(len(texts) - len(judged))})

    def verdicts(self, judge_prompts: Sequence[str]) -> tuple[list[float], int]:
        """(score per judge prompt, replies without a verdict), all prompts in one judge call."""
        s = self.settings
        if s.verdict == YES_PROBABILITY:
            logp = self.judge.yes_logprobs(judge_prompts, s.yes_word, s.no_word)
            return [yes_probability(float(y), float(n)) for y, n in logp], 0
        return verdict_scores(self.judge.replies(judge_prompts), self.rule, s.unparsed_score)


def judge_model(settings: RunSettings, task: Task | None = None, *, cache_dir: Path | None = None,
                log: Callable[[str], None] = print, judge: JudgeSettings | None = None) -> JudgeModel:
    """The judge `judge` (default: `settings.judge`) names: a Hugging Face folder, a run's policy, or
    (train_steps) a fresh preset warm-started on `task`'s judge examples (trainer.judge.trained), whose
    agreement with the task's answers on held-out examples is logged."""
    j = settings.judge if judge is None else judge
    if j.path:
        folder = build.model_folder(j.path)
        try:
            module, tokenizer = load_hf_model(folder), load_hf_tokenizer(folder)
        except (OSError, ValueError) as e:
            raise ConfigError(f"judge.path = {j.path!r}: not a model folder the judge can load ({e})") from None
        log(f"judge: {j.path}")
    elif j.run:
        try:
            run = load_run_policy(j.run, j.run_step)
        except FileNotFoundError as e:
            raise ConfigError(f"judge.run = {j.run!r}: {e}") from None
        module, tokenizer = run.model, run.tokenizer
        log(f"judge: the policy of {j.run} at step {run.step}")
    else:
        if task is None:
            raise ConfigError(f"judge.train_steps = {j.train_steps}: a judge is trained on a task's examples; no task given")
        module, tokenizer = trained_judge(j, task, settings.task.to_dict(), cache_dir=cache_dir, log=log)
    judge = JudgeModel(module, tokenizer, max_prompt_tokens=j.max_prompt_tokens, max_new_tokens=j.max_new_tokens,
                       engine=j.engine, paging=PAGED_TRANSFORMER)
    if j.train_steps:
        held = heldout_examples(task, j)
        log(f"judge: agrees with the task's answers on {agreement(JudgeReward(judge, j), held):.1%} of "
            f"{len(held.train)} held-out examples")
    return judge


def agreement(reward: JudgeReward, examples: Task) -> float:
    """The share of `examples` (trainer.judge.trained.judge_task: judge prompts with their `correct`
    flag) where the judge's score is above 1/2 exactly when the example is correct."""
    scores, _ = reward.verdicts([p.text for p in examples.train])
    return float(np.mean([(score > 0.5) == p.fields["correct"] for score, p in zip(scores, examples.train, strict=True)]))


def judge_rewards(settings: RunSettings, task: Task | None = None, *, cache_dir: Path | None = None,
                  log: Callable[[str], None] = print) -> tuple[RewardSpec, ...]:
    """The run's judge models' rewards (weighted; one judge model each), none when no entry names one."""
    specs = []
    for entry in model_judges(settings.rewards, settings.judge):
        judge = judge_model(settings, task, cache_dir=cache_dir, log=log, judge=entry.settings)
        specs.append(RewardSpec(JudgeReward(judge, entry.settings), weight=entry.weight, name=entry.name,
                                data_sources=entry.data_sources, timeout_s=entry.timeout_s, on_failure=entry.on_failure))
    return tuple(specs)
