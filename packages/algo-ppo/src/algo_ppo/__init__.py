"""PPO with a learned critic (Schulman et al. 2017, arXiv:1707.06347; for language models as in
Ouyang et al. 2022, arXiv:2203.02155, and verl's, OpenRLHF's and Tunix's PPO).

Changes from GRPO:
1. A critic: a second trained model (rl_models.value: the policy's backbone and a
   zero-initialised scalar head; with LoRA, its own adapters over the shared frozen
   base) with its own optimizer (`critic_learning_rate`), checkpointed beside the policy.
2. Token-level rewards: the sequence reward at the last completion token, minus
   beta * KL per token when beta > 0 (the KL is in the reward, not in the loss).
3. Advantages by GAE (arXiv:1506.02438) over the critic's values at collection time,
   `gamma` and `gae_lambda`, whitened over the batch's tokens ("gae", a
   `token_advantage_estimator`); no group baseline, so `group_size` 1 is allowed (the default).
4. The critic's clipped value loss (`value_clip`, `value_loss_coef`) against the returns
   A + V, on the same mini-batches as the policy; `critic_warmup_steps` train the critic alone.
5. Token-mean aggregation of the policy loss (verl's default).

The policy loss is GRPO's clipped surrogate (PPO's own), now with one advantage per token.
"""

from algo_ppo.config import PPOConfig
from algo_ppo.learner import PPOLearner
from rl_core import Algorithm

ALGORITHM = Algorithm(name="ppo", config=PPOConfig, learner=PPOLearner)

__all__ = ["ALGORITHM", "PPOConfig", "PPOLearner"]
