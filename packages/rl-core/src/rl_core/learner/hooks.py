"""The hooks an algorithm fills, in one place; rl_core.learner.base.RLLearner runs them in its
step (and rl_core.learner.pipeline.PolicyGradientLearner fills them with the pipeline).

A step is defined one way: `collect(prompts, supply)` (rollout and scoring: the batch and the
supply past it) and `examples_from(batch)` (train examples under the current weights); the
rest has defaults but `loss_function`, `num_iterations` and `group_size`.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from typing import Any

from rl_core.data import Prompt, Supply
from rl_core.rollout.async_rollout import Collection
from rl_core.train.trainable import LossFn
from rl_core.types import StepBatch


class AlgorithmHooks(abc.ABC):
    """What a learner's step asks of its algorithm."""

    models: Mapping[str, Any]
    """The trained models by name (the learner's)."""

    @abc.abstractmethod
    def collect(self, prompts: Sequence[Prompt], supply: Supply) -> tuple[Any, Supply]:
        """The rollout half of a step: sample (through `generate`) and score; returns the batch and
        `supply` as the collection leaves it (more prompts drawn, the carry, the key past its
        samples'). With async rollouts it runs beside the update, on the rollout thread: it must
        not read the trained parameters nor write what `examples_from` reads."""

    @abc.abstractmethod
    def examples_from(self, batch: Any) -> StepBatch:
        """The training half: what `collect` returned, as train examples under the current weights."""

    def collection(self) -> Collection:
        """How the collector runs `collect` (a variant may cut it in two, scoring apart:
        rl_core.rollout.async_rollout.Collection)."""
        return Collection(self.collect)

    @abc.abstractmethod
    def loss_function(self) -> LossFn:
        """The policy's loss of one micro-batch, `fn(model, example) -> LossOutput`, pure (the
        jitted update closes over it); called once, where the policy's first update needs it."""

    @property
    @abc.abstractmethod
    def num_iterations(self) -> int:
        """How many times each batch is trained on."""

    @property
    @abc.abstractmethod
    def group_size(self) -> int:
        """Completions per prompt (G)."""

    def models_to_update(self) -> Sequence[str]:
        """The models this step's update trains, in order (PPO's critic warm-up: the critic alone)."""
        return list(self.models)

    def heldout_metrics(self, prompts: Sequence[Prompt]) -> dict[str, float]:
        """Algorithm-specific metrics on held-out prompts, added to each evaluation (PPO: the
        critic's explained variance). Must not draw from the training key stream."""
        return {}
