"""RLOO: REINFORCE Leave-One-Out (Ahmadian et al. 2024, "Back to Basics", arXiv:2402.14740).

Changes from GRPO:
1. Advantage A_i = r_i - mean_{j != i} r_j: each completion's baseline is the
   mean reward of the other G - 1 completions of its prompt, so it does not
   depend on r_i itself (unbiased); no division by the group's std.
2. The whole completion is one action (REINFORCE on the sequence log-prob):
   token terms are summed within each sequence, then averaged over sequences
   ("seq-mean-token-sum"), not divided by each completion's length.
3. beta = 0: no KL term, so no reference model runs.

Everything else is GRPO's; the estimator is rl_core's "rloo".

The importance ratio stays GRPO's, one per token, clipped per token; TRL's RLOO
uses one per completion, exp(sum_t log-ratio). The two are equal (1, and the
same gradient) on a one-pass, one-mini-batch step, the default. They differ only
off-policy (several mini-batches or iterations), and there the token ratio is
kept on purpose: the product of T token ratios moves exponentially in T, so one
drifted token clips, and zeroes, the whole completion's gradient, while per-token
clipping drops only that token (PPO's and verl's choice). A sequence-level ratio
is what GSPO is for (`algo-gspo`, the geometric mean of the token ratios).
"""

import dataclasses

from algo_grpo import GRPOConfig, GRPOLearner
from rl_core import Algorithm


@dataclasses.dataclass(frozen=True, kw_only=True)
class RLOOConfig(GRPOConfig):
    """GRPOConfig with RLOO's three changes as defaults."""

    advantage_estimator: str = "rloo"
    loss_agg_mode: str = "seq-mean-token-sum"
    beta: float = 0.0


class RLOOLearner(GRPOLearner):
    """RLOO (arXiv:2402.14740): the GRPO learner, every change a config default."""


ALGORITHM = Algorithm(name="rloo", config=RLOOConfig, learner=RLOOLearner)
