"""The learner's log-prob pass over completions, and the behaviour-policy contract.

Every example carries `old_logp`, the log-probs of the policy that generated its
tokens, from the learner's own forward pass (`PolicyLogprobs.behaviour`) at collection
time, whenever the update can be off-policy: more than one pass over the batch, more
than one mini-batch (the policy moves between optimizer steps; `LogprobPasses.off_policy`
states these two), or rows carried over from an earlier step
(they keep the log-probs recorded when they were collected, checkpoints included; the
algorithm that carries them records them). Only on a provably on-policy step may
`old_logp` be None: the loss then uses stop_gradient(logp), which is exactly equal in
value. With async rollouts the sampler's weights are up to k steps (training.max_staleness) older:
`old_logp` is then the proximal policy's, the current weights' when the step trains
(decoupled PPO; see rl_core.learner.pipeline).

`LogprobPasses` decides, in this one place, which log-prob passes a step of the pipeline
(rl_core.learner.pipeline) runs besides the update's own: the behaviour pass (at collection time
for carried rows, before the update for the others), the reference pass, and the distillation
teacher's pass (`PolicyLogprobs` of a rl_core.train.frozen_model.FrozenModel: the reference's
program and micro-batches, over the teacher's weights).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import numpy as np

from rl_core.runtime import multihost
from rl_core.config import RolloutConfig
from rl_core.policy.logprobs import completion_logprobs
from rl_core.train.frozen_model import FrozenModel
from rl_core.train.trainable import TrainableModel
from rl_core.types import TrainExample


def logprob_fn(rollout: RolloutConfig) -> Any:
    """What the policy's log-prob pass runs per micro-batch: `completion_logprobs` at the sampler's
    temperature, unembedded `logprob_chunk_tokens` at a time (trainer.plan compiles the same pass)."""
    return functools.partial(completion_logprobs, temperature=rollout.temperature,
                             chunk_tokens=rollout.logprob_chunk_tokens)


class PolicyLogprobs:
    """(logp, entropy) [B, T] of completions under given trained parameters of the policy (or of a
    frozen model's parameters: a FrozenModel makes the same pass)."""

    def __init__(self, policy: TrainableModel | FrozenModel, rollout: RolloutConfig, *, replays: bool = True) -> None:
        """`replays`: the pass takes the example's recorded routing (routing replay: the policy's own
        passes; not another model's, e.g. a distillation teacher's)."""
        self.replays = replays
        self.program = policy.forward(logprob_fn(rollout), chunk_tokens=rollout.logprob_chunk_tokens,
                                      packs=policy.layout.packing, shares=True)

    def __call__(self, params: Any, example: TrainExample) -> tuple[jax.Array, jax.Array]:
        """Of the example's completions (0 past the trimmed width, see rl_core.train.trim)."""
        return self.behaviour_pass(params, example.prompt_tokens, example.prompt_mask, example.completion_tokens,
                                   example.routing, mask=example.completion_mask)

    def behaviour_pass(self, params: Any, prompt_tokens: Any, prompt_mask: Any, completion_tokens: Any,
                       routing: Any = None, *, mask: Any = None) -> tuple[jax.Array, jax.Array]:
        """The program on these rows, replaying `routing` [B, T, layers, k] when given and `replays`."""
        replayed = () if routing is None or not self.replays else (routing,)
        return self.program(params, prompt_tokens, prompt_mask, completion_tokens, *replayed, mask=mask)

    def behaviour(self, params: Any, prompt_tokens: Any, prompt_mask: Any, completion_tokens: Any, *,
                  recorded: np.ndarray | None = None, completion_mask: Any = None, routing: Any = None) -> np.ndarray:
        """[B, T] float32 log-probs on the host; rows of `recorded` without NaN were recorded
        earlier (carried rows) and are kept as they are. With `completion_mask`, the pass runs
        at the trimmed width (0 beyond it); `routing`: replayed (see `behaviour_pass`)."""
        logp, _ = self.behaviour_pass(params, prompt_tokens, prompt_mask, completion_tokens, routing,
                                      mask=completion_mask)
        fresh = np.asarray(multihost.to_host(logp), np.float32)
        if recorded is None:
            return fresh
        missing = np.isnan(recorded).any(axis=1)
        return np.where(missing[:, None], fresh, recorded).astype(np.float32)


@dataclasses.dataclass(frozen=True)
class LogprobPasses:
    """Which log-prob passes a step runs, from the run's settings (fixed for a run).

    behaviour  `old_logp`, the policy that sampled the rows: needed when the update is
               off-policy, or when a KL penalty in the rewards reads it (PPO); otherwise the
               loss uses stop_gradient(logp), equal in value on a provably on-policy step. A
               rollout correction needs no pass of its own: on such a step it divides that
               same stop_gradient(logp) by the sampler's log-probs (with async rollouts it is
               the proximal policy's: the weights the step starts from).
    proximal   with async rollouts, every row's `old_logp` is the current weights' when the
               step trains on it (decoupled PPO's proximal policy): none is recorded at
               collection, and none recorded earlier is kept.
    reference  the reference policy's log-probs, when beta != 0: for the KL term in the loss,
               or (`kl_in_rewards`) for the KL penalty in the rewards.
    teacher    the distillation teacher's log-probs, when distill_coef != 0 (rl_core.math.distillation).
    """

    off_policy: bool
    """Several passes over the batch or several mini-batches: an update can run on a policy other than the one that sampled."""
    proximal: bool
    """Async rollouts (training.async_rollout != "off")."""
    beta: float
    """The config's KL coefficient; 0 = no reference policy."""
    kl_in_rewards: bool = False
    """The KL penalty goes into the rewards (PPO), not into the loss."""
    distill: bool = False
    """On-policy distillation is on (distill_coef != 0): the teacher pass runs."""

    @classmethod
    def of(cls, config: Any, *, num_mini_batches: int, async_rollout: str) -> LogprobPasses:
        """The passes of a run of `config` (a PolicyGradientConfig) whose batch splits into
        `num_mini_batches`: what the learner decides, and what `trainer plan` compiles."""
        return cls(
            off_policy=config.num_iterations > 1 or num_mini_batches > 1,
            proximal=async_rollout != "off",
            beta=config.beta, kl_in_rewards=config.kl_in_rewards, distill=bool(config.distill_coef),
        )

    @property
    def reference(self) -> bool:
        """The reference pass runs (and the reference parameters are kept)."""
        return bool(self.beta)

    @property
    def teacher(self) -> bool:
        """The teacher pass runs (and the teacher's weights are kept)."""
        return self.distill

    @property
    def loss_beta(self) -> float:
        """The coefficient of the KL term in the loss: 0 when the KL is in the rewards."""
        return 0.0 if self.kl_in_rewards else self.beta

    @property
    def behaviour(self) -> bool:
        """A fresh batch (no row recorded earlier) needs the behaviour pass before the update."""
        return self.off_policy or (self.kl_in_rewards and self.reference)

    def at_collection(self, missing: np.ndarray) -> bool:
        """Record behaviour log-probs at collection time, for the rows `missing` [N] bool them
        (rows a step carries to the next): never with proximal log-probs (the update may be
        changing the weights while a batch is collected)."""
        return not self.proximal and bool(missing.any())

    def before_update(self, recorded: np.ndarray | None) -> tuple[bool, np.ndarray | None]:
        """(run the behaviour pass before the update, the rows recorded earlier that it keeps):
        with rows recorded earlier (NaN rows: not recorded) it runs only when some row lacks
        them, whatever `behaviour` says; proximal log-probs keep none."""
        kept = None if self.proximal else recorded
        return (self.behaviour if kept is None else bool(np.isnan(kept).any())), kept
