"""DAPO: Decoupled Clip and Dynamic sAmpling Policy Optimization (Yu et al. 2025, arXiv:2503.14476).

Changes from GRPO:
1. Clip-higher: epsilon_high = 0.28 > epsilon_low = 0.2, so low-probability
   tokens can grow and entropy does not collapse.
2. Dynamic sampling: groups whose rewards are all equal carry no gradient;
   they are dropped and new prompts sampled until B informative groups exist
   (surplus carried to the next step).
3. Token-level loss: "token-mean" over the whole batch, so long completions
   weigh by their tokens.
4. Overlong reward shaping: a soft length penalty in tokens over the last
   L_cache tokens before L_max (optionally also overlong filtering).
5. No KL term (beta = 0): no reference model runs.
"""

from algo_dapo.config import DAPOConfig, OverlongConfig
from algo_dapo.learner import DAPOLearner, DynamicSamplingError
from algo_dapo.overlong import overlong_penalty, overlong_shaping
from rl_core import Algorithm

ALGORITHM = Algorithm(name="dapo", config=DAPOConfig, learner=DAPOLearner)

__all__ = [
    "ALGORITHM",
    "DAPOConfig",
    "DAPOLearner",
    "DynamicSamplingError",
    "OverlongConfig",
    "overlong_penalty",
    "overlong_shaping",
]
