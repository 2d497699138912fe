"""A judge model as a reward: a second model scores each completion (docs/judge-rewards.md).

settings  `judge:` settings (JudgeSettings)
template  the judge's prompt template and the verdict glue (pure)
model     the judge model on the project's own rollout engine (greedy replies, yes/no log-probs)
reward    the reward function the reward manager calls, and how a run builds it (imported as
          trainer.judge.reward: it builds on trainer.build and trainer.run, which read the settings)
"""

from trainer.judge.model import JudgeModel
from trainer.judge.settings import VERDICTS, YES_PROBABILITY, JudgeSettings
from trainer.judge.template import DEFAULT_TEMPLATE, JudgeTemplate, verdict_scores

__all__ = [
    "DEFAULT_TEMPLATE", "VERDICTS", "YES_PROBABILITY", "JudgeModel", "JudgeSettings", "JudgeTemplate", "verdict_scores",
]
