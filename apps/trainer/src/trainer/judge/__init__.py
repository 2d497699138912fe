"""A judge model as a reward: a second model scores each completion (docs/judge-rewards.md).

model     the judge model on the project's own rollout engine (greedy replies, yes/no log-probs)
trained   a judge trained from the task's own examples
reward    the reward function the reward manager calls, and how a run builds it (imported as
          trainer.judge.reward: it builds on trainer.build and trainer.run, which read the settings)

Its settings (`judge:`, trainer.settings.judge) and its prompt template with the verdict glue
(trainer.settings.judge_template) are settings, read without loading an engine.
"""

from trainer.judge.model import JudgeModel
from trainer.settings.judge import VERDICTS, YES_PROBABILITY, JudgeSettings
from trainer.settings.judge_template import DEFAULT_TEMPLATE, JudgeTemplate, verdict_scores

__all__ = [
    "DEFAULT_TEMPLATE", "VERDICTS", "YES_PROBABILITY", "JudgeModel", "JudgeSettings", "JudgeTemplate", "verdict_scores",
]
