"""GRPO: Group Relative Policy Optimization (Shao et al. 2024, arXiv:2402.03300).

The parent of the other algorithm packages: a config, a learner whose
pipeline steps they override, and the `ALGORITHM` value that the entry point
`grpo = "algo_grpo:ALGORITHM"` points at.
"""

from algo_grpo.config import GRPOConfig
from algo_grpo.groups import Groups
from algo_grpo.learner import GRPOLearner
from rl_core.registry import Algorithm

ALGORITHM = Algorithm(name="grpo", config=GRPOConfig, learner=GRPOLearner)

__all__ = ["ALGORITHM", "GRPOConfig", "GRPOLearner", "Groups"]
