"""OPD: on-policy distillation from a frozen teacher (Thinking Machines, "On-Policy Distillation",
Lu et al. 2025; GKD, Agarwal et al. 2024, arXiv:2306.13649; prime-rl's `opd`, slime's `--opd-kl-coef`).

The student samples G completions per prompt; the teacher scores the student's own tokens; each
token's advantage is the negative sampled reverse KL, A_t = -(log pi_old(y_t) - log pi_T(y_t))
(rl_core.math.distillation, the Tinker cookbook's per-token advantage), used with the
policy-gradient loss. The teacher runs like the reference policy: a forward pass only, micro-batched
and sharded as the reference's (rl_core.train.frozen_model), given to the learner as `teacher=`
(the trainer loads `algorithm.teacher`: a Hugging Face folder or a run folder).

Changes from GRPO:
1. No reward signal: advantage_estimator = "zero" (rewards are still scored and logged).
2. distill_coef = 1.0: the teacher's per-token term is the whole advantage.
3. beta = 0: the teacher anchors the student; no reference policy is kept.
4. loss_agg_mode = "token-mean": every sampled token's reverse KL weighs the same (Tinker sums
   per token; the mean keeps the learning rate's scale).
Any RL algorithm plus distillation is a setting, not a package: e.g. GRPO with
`algorithm.distill_coef=0.5 algorithm.teacher=DIR`.
"""

import dataclasses

from algo_grpo import GRPOConfig, GRPOLearner
from rl_core import Algorithm


@dataclasses.dataclass(frozen=True, kw_only=True)
class OPDConfig(GRPOConfig):
    """On-policy distillation (arXiv:2306.13649): GRPO's learner, each token's advantage the teacher's reverse KL.

    GRPOConfig with on-policy distillation's changes as defaults."""

    advantage_estimator: str = "zero"
    distill_coef: float = 1.0
    beta: float = 0.0
    loss_agg_mode: str = "token-mean"


ALGORITHM = Algorithm(name="opd", config=OPDConfig, learner=GRPOLearner)

__all__ = ["ALGORITHM", "OPDConfig"]
