"""Dr. GRPO: GRPO Done Right (Liu et al. 2025, "Understanding R1-Zero-Like Training", arXiv:2503.20783).

Changes from GRPO:
1. Advantage A_i = r_i - mean(r): no division by the group's std, which
   over-weights questions that are too easy or too hard.
2. Loss aggregation "seq-mean-token-sum-norm": each sequence's token sum is
   divided by the constant L_max instead of its own length, which removed
   the bias towards long wrong answers.
3. beta = 0: no KL term, so no reference model runs.
"""

import dataclasses

from algo_grpo import GRPOConfig, GRPOLearner
from rl_core import Algorithm, group_centered


@dataclasses.dataclass(frozen=True, kw_only=True)
class DrGRPOConfig(GRPOConfig):
    """GRPOConfig with Dr. GRPO's three changes as defaults."""

    advantage_estimator: str = "dr_grpo"
    loss_agg_mode: str = "seq-mean-token-sum-norm"
    beta: float = 0.0


class DrGRPOLearner(GRPOLearner):
    """The GRPO learner unchanged: every Dr. GRPO change is a config default."""


def dr_grpo_advantages(rewards, group_size):
    """A_i = r_i - mean(r) within each group; exactly 0 for uniform groups."""
    return group_centered(rewards, group_size)


ALGORITHM = Algorithm(
    name="dr_grpo",
    config=DrGRPOConfig,
    learner=DrGRPOLearner,
    functions={"advantage_estimator": {"dr_grpo": dr_grpo_advantages}},
)
