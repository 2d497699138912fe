"""GRPO: Group Relative Policy Optimization (Shao et al. 2024, arXiv:2402.03300).

GRPO is rl-core's policy-gradient pipeline with its default settings: the pipeline
(rl_core.learner.pipeline.PolicyGradientLearner), its config's fields and defaults
(rl_core.pipeline_config.PolicyGradientConfig), the scored groups (rl_core.learner.groups)
and the clipped objective (rl_core.train.objective) live in rl-core. This package names
them GRPO's: the config, the learner the GRPO variants (Dr. GRPO, DAPO, RLOO, GSPO,
CISPO, REINFORCE++) derive from, and the `ALGORITHM` value that the entry point
`grpo = "algo_grpo:ALGORITHM"` points at.
"""

import dataclasses

from rl_core import Algorithm, PolicyGradientConfig, PolicyGradientLearner


@dataclasses.dataclass(frozen=True, kw_only=True)
class GRPOConfig(PolicyGradientConfig):
    """GRPO (Shao et al. 2024, arXiv:2402.03300): PolicyGradientConfig's defaults are GRPO's."""


class GRPOLearner(PolicyGradientLearner):
    """Group Relative Policy Optimization (arXiv:2402.03300), Algorithm 1.

    For each batch of prompts: sample G completions per prompt, score them,
    normalise rewards within each group into advantages, and take
    clipped-surrogate steps with a KL penalty to the initial policy.
    """


ALGORITHM = Algorithm(name="grpo", config=GRPOConfig, learner=GRPOLearner)

__all__ = ["ALGORITHM", "GRPOConfig", "GRPOLearner"]
