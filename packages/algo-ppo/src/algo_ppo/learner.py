"""PPOLearner: rl-core's policy-gradient pipeline (rl_core.learner.pipeline) with a critic trained beside the policy.

_example_from_groups(groups)       (the pipeline's step, overridden)
  = _to_example -> _add_logprobs   behaviour log-probs when the update can be off-policy or
                                   beta > 0, reference log-probs when beta > 0
  -> critic_values(example)        V(s_t) [B, T] at collection time
  -> advantages                    token rewards, GAE, whitening: one jitted program

The update (rl_core.learner.base) then trains each mini-batch twice: the policy with
the pipeline's clipped surrogate (rl_core.train.objective) on per-token advantages, the
critic with `critic_loss`.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from rl_core import (
    aggregate, clipped_value_loss, explained_variance, gae, Groups, LossFn, LossOutput, PolicyGradientLearner,
    Prompt, registry, token_rewards, TrainExample, ValueFunction,
)
from rl_core.runtime import multihost
from rl_core.episodes import turn_reward_tokens
from rl_core.learner import StepBatch
from rl_core.policy import completion_values, written_logp

from algo_ppo.config import PPOConfig

CRITIC = "critic"
HELDOUT_SEED = 0x5EED
"""Held-out rollouts draw from their own key (folded with the step), never the training stream."""


def critic_loss(model: ValueFunction, example: TrainExample, *, clip: float | None, coef: float) -> LossOutput:
    """coef * the clipped value loss of the critic's values against the example's returns, token-mean."""
    values = completion_values(model, example.prompt_tokens, example.prompt_mask, example.completion_tokens,
                               written_logp(example))
    mask = example.completion_mask
    loss, clipped = clipped_value_loss(values, example.values, example.returns, mask, clip=clip)
    total, denom = aggregate("token-mean", loss, mask, max_len=mask.shape[1])
    count = jnp.sum(mask)
    means = {
        "critic/value_loss": (total, denom),
        "critic/clip_frac": (jnp.sum(clipped), count),
        "critic/values_mean": (jnp.sum(values * mask), count),
    }
    return LossOutput(coef * total, denom, means=means)


def advantage_program(c: PPOConfig) -> Callable[..., Any]:
    """The configured token estimator (GAE) over the rewards placed on tokens (the KL penalty and
    the turns' rewards included), jitted: (rewards, values, mask, kl, turn_rewards) -> (adv, returns)."""
    estimator = registry.get("token_advantage_estimator", c.advantage_estimator)

    def program(rewards, values, mask, kl, turn_rewards):
        placed = token_rewards(rewards, mask, kl=kl, beta=c.beta) + turn_rewards
        return estimator(placed, values, mask, gamma=c.gamma, lam=c.gae_lambda)

    return jax.jit(program)


class PPOLearner(PolicyGradientLearner):
    """PPO (arXiv:1707.06347): a policy and a critic, per-token advantages by GAE."""

    extra_models = (CRITIC,)
    config: PPOConfig

    def __init__(self, config: PPOConfig, *, critic: ValueFunction, **kwargs: Any) -> None:
        super().__init__(config, **kwargs)
        self._add_model(CRITIC, critic, learning_rate=config.critic_learning_rate or self.training.learning_rate,
                       loss=functools.partial(self.critic_loss_function, config))
        self._values = self.models[CRITIC].forward(completion_values, chunk_tokens=self.rollout.logprob_chunk_tokens)
        self._kl_reward = registry.get("kl_estimator", config.kl_estimator) if config.beta else None
        self._advantages = advantage_program(config)

    @staticmethod
    def critic_loss_function(config: PPOConfig) -> LossFn:
        """The critic's loss of one micro-batch, `critic_loss` with `config`'s clip and coefficient
        bound: a pure function of the config (`trainer plan` compiles the critic's update on it)."""
        return functools.partial(critic_loss, clip=config.value_clip, coef=config.value_loss_coef)

    @classmethod
    def example_spec(cls, config: PPOConfig, passes: Any, **shape: int) -> TrainExample:
        """The pipeline's example plus the critic's targets and its values at collection time."""
        example = super().example_spec(config, passes, **shape)
        return example._replace(returns=example.completion_mask, values=example.completion_mask)

    # -- what changes from GRPO ------------------------------------------------------------

    def _models_to_update(self) -> Sequence[str]:
        return [CRITIC] if self.step < self._config.critic_warmup_steps else [*self.models]

    def _example_from_groups(self, groups: Groups, tally: dict[str, float] | None = None) -> TrainExample:
        """Log-probs (the KL penalty needs them), the critic's values, then GAE."""
        example = self._to_example(groups, np.zeros(len(groups.rewards), np.float32))  # advantages: below
        start = time.perf_counter()
        example = self._add_logprobs(example)
        values = self.critic_values(example)
        if tally is not None:
            tally["time/logprob"] = time.perf_counter() - start
        kl = None if self._kl_reward is None else self._kl_reward(example.old_logp, example.ref_logp)
        adv, returns = self._advantages(groups.rewards, values, example.completion_mask, kl, self._turn_rewards(groups))
        return example._replace(advantages=np.asarray(adv), returns=np.asarray(returns), values=values)

    def _turn_rewards(self, groups: Groups) -> np.ndarray:
        """[B, T] the environment's per-turn rewards at their turns' last tokens (episodes only)."""
        episodes = groups.row_fields.get("episode") if self._config.turn_rewards else None
        return turn_reward_tokens(episodes, *groups.completion_mask.shape)

    def _compute_advantages(self, groups: Groups) -> np.ndarray:
        """Per-token advantages [B, T] of scored groups (they need the critic and the log-probs)."""
        return self._example_from_groups(groups).advantages

    def critic_values(self, example: TrainExample) -> np.ndarray:
        """[B, T] float32 values of the example's completions under the current critic, on the host."""
        if self._meter is not None:
            self._meter.scored(CRITIC, example)
        values = self._values(self.state.models[CRITIC].params, example.prompt_tokens, example.prompt_mask,
                              example.completion_tokens,
                              written_logp(example), mask=example.completion_mask)
        return np.asarray(multihost.to_host(values), np.float32)

    # -- reporting ---------------------------------------------------------------------------

    def _examples_from(self, groups: Groups) -> StepBatch:
        batch = super()._examples_from(groups)
        ex = batch.example
        mask = ex.completion_mask
        fit = float(explained_variance(ex.values, ex.returns, mask))  # against the lambda-returns it learns
        count = max(float(mask.sum()), 1.0)
        metrics = {**batch.metrics, "critic/explained_variance": fit,
                   "critic/returns_mean": float((ex.returns * mask).sum() / count)}
        return batch._replace(metrics=metrics)

    def _group_metrics(self, groups: Groups, advantages: np.ndarray) -> dict[str, float]:
        return super()._group_metrics(groups, advantages[groups.completion_mask > 0])  # over real tokens

    def _samples(self, groups: Groups, advantages: np.ndarray) -> list[dict[str, Any]]:
        return super()._samples(groups, advantages[:, 0])  # the first token's: the whole completion's signal

    def heldout_rollouts(self, prompts: Sequence[Prompt], key: jax.Array) -> tuple[Groups, TrainExample]:
        """G scored completions per prompt, sampled with `key` (not the training stream), and their
        example without advantages: what `critic_values` reads and the held-out metrics score."""
        groups = self._score(self._rollout_groups(prompts, key=key))
        return groups, self._to_example(groups, np.zeros(len(groups.rewards), np.float32))

    def heldout_metrics(self, prompts: Sequence[Prompt]) -> dict[str, float]:
        """The critic's explained variance of the Monte Carlo return (lambda = 1, no KL) on G
        completions per held-out prompt, sampled with a key of their own."""
        key = jax.random.fold_in(jax.random.PRNGKey(HELDOUT_SEED), self.step)
        groups, example = self.heldout_rollouts(prompts, key)
        values, mask = self.critic_values(example), example.completion_mask
        _, returns = gae(token_rewards(groups.rewards, mask), np.zeros_like(values), mask, gamma=self._config.gamma,
                         lam=1.0)
        return {"eval/critic_explained_variance": float(explained_variance(values, returns, mask))}
