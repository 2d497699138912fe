"""`judge:` settings: a second model that scores completions as a reward (docs/judge-rewards.md)."""

from __future__ import annotations

import dataclasses

from rewards.verdicts import VERDICT_RULES, make_verdict_rule
from rl_core import check, check_registered, Config, ConfigError, registry

from trainer.settings.judge_template import DEFAULT_TEMPLATE, JudgeTemplate

YES_PROBABILITY = "yes_probability"
"""The verdict read from the judge's next-token distribution: P(yes) / (P(yes) + P(no))."""

VERDICTS = (*VERDICT_RULES, YES_PROBABILITY)


@dataclasses.dataclass(frozen=True, kw_only=True)
class JudgeSettings(Config):
    """The judge model, its prompt and how its reply becomes a score; off until a model is named."""

    path: str | None = None
    """A Hugging Face model folder (config.json, safetensors, tokenizer): the judge."""
    run: str | None = None
    """A run folder (`trainer train --output DIR`): its policy at checkpoint `run_step` is the judge."""
    run_step: int | None = None
    """The checkpoint of `run` (None: the latest)."""
    train_steps: int = 0
    """> 0: a fresh judge of `preset` warm-started for this many steps on the task's judge examples
    (a task that brings them, e.g. `number_words`), cached beside the base policy."""
    preset: str = "tiny"
    """The model preset of a judge trained with `train_steps`."""
    name: str = "judge"
    """The reward's name (metrics `rewards/<name>/mean`, `time/<name>`)."""
    weight: float = 1.0
    """Multiplies the judge's scores in the total reward."""
    template: str = DEFAULT_TEMPLATE
    """The judge's prompt, with {prompt}, {completion} and {reference} (the task's `reference_field`)."""
    reference_field: str = "answer"
    """The task field that fills {reference}."""
    verdict: str = "yes_no"
    """How the reply becomes a score in [0, 1]: a rule of rewards.verdicts (number, yes_no, rubric) on the
    greedy reply, or yes_probability (the judge's next-token probabilities of `yes_word` and `no_word`)."""
    verdict_options: dict = dataclasses.field(default_factory=dict)
    """The rule's parameters, e.g. {low: 0, high: 10} for `number`."""
    yes_word: str = "yes"
    """yes_probability: the reply whose first token counts as yes."""
    no_word: str = "no"
    """yes_probability: the reply whose first token counts as no."""
    unparsed_score: float = 0.0
    """The score of a reply that holds no verdict (counted in `rewards/<name>/unparsed`) and of a judge
    prompt too long to judge (`rewards/<name>/too_long`)."""
    max_prompt_tokens: int = 256
    """Longest judge prompt in the judge's tokens; a longer one is not judged: it scores `unparsed_score`
    and is counted in `rewards/<name>/too_long`."""
    max_new_tokens: int = 8
    """Most tokens of the judge's reply (greedy)."""
    engine: str = "auto"
    """The judge's rollout engine (as rollout.engine): static, paged, or auto."""

    def __post_init__(self) -> None:
        super().__post_init__()
        sources = [name for name in ("path", "run") if getattr(self, name)] + (["train_steps"] if self.train_steps else [])
        check(len(sources) <= 1, self, sources[-1] if sources else "path",
              f"name one judge model: {' and '.join(sources)} are both set")
        check(self.train_steps >= 0, self, "train_steps", "must be >= 0 (0: the judge is loaded from path or run)")
        check(self.run_step is None or self.run is not None, self, "run_step", "needs judge.run")
        check(self.verdict in VERDICTS, self, "verdict", f"must be one of {VERDICTS}")
        check(bool(self.name) and self.name.isidentifier(), self, "name", "must be a word (letters, digits, _)")
        check(self.max_prompt_tokens >= 1, self, "max_prompt_tokens", "must be >= 1")
        check(self.max_new_tokens >= 1, self, "max_new_tokens", "must be >= 1")
        if self.engine != "auto":  # a registered engine (rl_core.rollout.engines)
            check_registered(self, "engine", registry.ENGINE)
        check(bool(self.reference_field), self, "reference_field", "must name a task field")
        check(0.0 <= self.unparsed_score <= 1.0, self, "unparsed_score", "must be in [0, 1], like every verdict")
        try:
            JudgeTemplate(self.template)
            self.rule()
        except ValueError as e:
            raise ConfigError(f"JudgeSettings: {e}") from None
        if self.verdict == YES_PROBABILITY:
            check(bool(self.yes_word) and bool(self.no_word) and self.yes_word != self.no_word, self, "yes_word",
                  f"yes_word and no_word must be two different non-empty words (got {self.yes_word!r}, {self.no_word!r})")

    @property
    def on(self) -> bool:
        """A judge model is named: the run adds the judge's reward."""
        return bool(self.path or self.run or self.train_steps)

    def rule(self):
        """The verdict rule of rewards.verdicts (None for yes_probability, which reads log-probs)."""
        if self.verdict == YES_PROBABILITY:
            if self.verdict_options:
                raise ValueError(f"verdict_options = {self.verdict_options!r}: yes_probability takes none "
                                 "(set yes_word and no_word)")
            return None
        return make_verdict_rule(self.verdict, **self.verdict_options)
