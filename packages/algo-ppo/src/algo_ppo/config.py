"""PPOConfig: the policy-gradient pipeline's knobs (rl_core.pipeline_config) plus the critic's and GAE's."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from rl_core import check, PolicyGradientConfig


@dataclasses.dataclass(frozen=True, kw_only=True)
class PPOConfig(PolicyGradientConfig):
    """PPO (arXiv:1707.06347) with a critic and GAE; see the package docstring."""

    estimator_category: ClassVar[str] = "token_advantage_estimator"
    kl_in_rewards: ClassVar[bool] = True
    """The KL penalty is in the rewards (verl's use_kl_in_reward), not a term of the loss."""

    group_size: int = 1
    """Completions sampled per prompt (>= 1; the critic is the baseline, so 1 is PPO's usual)."""
    advantage_estimator: str = "gae"
    """Token rewards and the critic's values -> per-token advantages and returns (a
    `token_advantage_estimator` name)."""
    loss_agg_mode: str = "token-mean"
    beta: float = 0.0
    """Coefficient of the per-token KL penalty in the rewards, r_t -= beta * KL_t (verl's
    use_kl_in_reward; off by default, as there); 0 runs no reference model."""
    kl_estimator: str = "k1"
    """KL estimator of the reward penalty, of the behaviour log-probs against the reference's
    (k1 = log pi_old - log pi_ref, verl's default "kl")."""
    gamma: float = 1.0
    """Discount per token (1: the sequence reward counts in full at every token)."""
    gae_lambda: float = 0.95
    """GAE's lambda: 1 = Monte Carlo returns (unbiased, noisy), 0 = one-step TD (biased by the critic)."""
    value_clip: float | None = 0.2
    """c of the clipped value loss: one update moves a value at most c from its collection-time value
    (None = plain squared error)."""
    value_loss_coef: float = 1.0
    """Scales the critic's loss. With its own optimizer it changes only what gradient clipping
    (training.max_grad_norm) and plain SGD see; AdamW is otherwise invariant to it."""
    critic_learning_rate: float | None = None
    """The critic's peak learning rate (same optimizer and schedule as the policy's);
    None = training.learning_rate."""
    critic_warmup_steps: int = 0
    """Steps at the start in which only the critic trains (verl's critic_warmup)."""
    turn_rewards: bool = True
    """Multi-turn episodes (rollout.environment): the environment's reward for each model turn
    goes on that turn's last token, beside the task's reward on the episode's last token. Turn
    it off when the task's reward functions already add the environment's return."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check(0.0 <= self.gamma <= 1.0, self, "gamma", "must be in [0, 1]")
        check(0.0 <= self.gae_lambda <= 1.0, self, "gae_lambda", "must be in [0, 1]")
        check(self.value_clip is None or self.value_clip > 0, self, "value_clip", "must be > 0 or None (no clip)")
        check(self.value_loss_coef > 0, self, "value_loss_coef", "must be > 0")
        check(self.critic_learning_rate is None or self.critic_learning_rate > 0, self, "critic_learning_rate",
              "must be > 0 or None (training.learning_rate)")
        check(self.critic_warmup_steps >= 0, self, "critic_warmup_steps", "must be >= 0")
