"""The hooks an algorithm fills, in one place; rl_core.learner.base.RLLearner runs them in its
step (and rl_core.learner.pipeline.PolicyGradientLearner fills them with the pipeline).

A step is defined by two hooks: a collection (rollout and scoring: the batch and the supply past
it), which `_collection()` hands the collector either in one piece, as `_collect(prompts,
supply)`, or cut in two with the scoring on its own (the pipeline's, rl_core.learner.pipeline),
then `_examples_from(batch)` (train examples under the current weights); the rest has defaults but
`_loss_function`. How many completions per prompt and passes over a batch are the config's
(`AlgorithmConfig.group_size`, `.num_iterations`).

The hooks a subclass fills or calls are protected (one underscore): they are the learner's
interface to its algorithm, not to its callers, whose names (a short list: the settings and
parts, the state, the loop) docs/concepts/architecture.md gives. The names a caller reads of
the algorithm are public: `heldout_metrics`, `extra_models`, and the pipeline's classmethods
`loss_of` and `example_spec`, which `trainer plan` compiles without a learner.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from typing import Any

from rl_core.data import CollectionInputs, Prompt
from rl_core.rollout.async_rollout import Collection
from rl_core.train.trainable import LossFn
from rl_core.types import StepBatch


class AlgorithmHooks(abc.ABC):
    """What a learner's step asks of its algorithm."""

    models: Mapping[str, Any]
    """The trained models by name (the learner's)."""

    @abc.abstractmethod
    def _collect(self, prompts: Sequence[Prompt], supply: CollectionInputs) -> tuple[Any, CollectionInputs]:
        """The rollout half of a step: sample (through `_generate`) and score; returns the batch and
        `supply` as the collection leaves it (more prompts drawn, the carry, the key past its
        samples'). The collector runs it when `_collection()` keeps the collection whole; a cut
        collection runs its own two functions instead. With async rollouts a whole collection
        runs on the rollout thread beside the update (in a multi-process run, on the calling
        thread once the update is dispatched), with the weights pinned for it: it samples only
        through `_generate`, never with the trained parameters, and writes nothing
        `_examples_from` reads."""

    @abc.abstractmethod
    def _examples_from(self, batch: Any) -> StepBatch:
        """The training half: what `_collect` returned, as train examples under the current weights."""

    def _collection(self) -> Collection:
        """How the collector runs `_collect` (a variant may cut it in two, scoring apart:
        rl_core.rollout.async_rollout.Collection)."""
        return Collection(self._collect)

    @abc.abstractmethod
    def _loss_function(self) -> LossFn:
        """The policy's loss of one micro-batch, `fn(model, example) -> LossOutput`, pure (the
        jitted update closes over it); called once, where the policy's first update needs it."""

    def _models_to_update(self) -> Sequence[str]:
        """The models this step's update trains, in order (PPO's critic warm-up: the critic alone)."""
        return list(self.models)

    def heldout_metrics(self, prompts: Sequence[Prompt]) -> dict[str, float]:
        """Algorithm-specific metrics on held-out prompts, added to each evaluation (PPO: the
        critic's explained variance). Must not draw from the training key stream."""
        return {}
