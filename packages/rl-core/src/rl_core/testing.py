"""Shipped test doubles: a toy algorithm whose loss is advantage-weighted log-prob.

`ToyLearner` exercises everything the base learner owns (rollout, mini- and
micro-batches, the update, checkpoints) with the simplest policy-gradient
loss, -A * logp aggregated by the configured mode. Its reward is the
fraction of completion tokens equal to `ToyConfig.target_token`, computed
from token ids so that it needs no reward package.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rl_core import registry
from rl_core.config import AlgorithmConfig, check
from rl_core.data import Prompt
from rl_core.learner.base import RLLearner, StepBatch
from rl_core.policy.logprobs import completion_logprobs
from rl_core.train.trainable import LossFn, LossOutput
from rl_core.types import TrainExample


@dataclasses.dataclass(frozen=True, kw_only=True)
class ToyConfig(AlgorithmConfig):
    group_size: int = 4
    """Completions per prompt."""
    target_token: int = 5
    """Token id the reward counts."""
    inject_nan: bool = False
    """Make the loss NaN (tests the non-finite guard)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check(self.group_size >= 2, self, "group_size", "must be >= 2")


class ToyLearner(RLLearner[ToyConfig]):
    @property
    def num_iterations(self) -> int:
        return 1

    @property
    def group_size(self) -> int:
        return self.config.group_size

    def trajectory_ids(self, prompts: Sequence[Prompt]) -> list[str]:
        return [f"{self.step}/{i}/{j}" for i in range(len(prompts)) for j in range(self.group_size)]

    def produce_examples(self, prompts: Sequence[Prompt]) -> StepBatch:
        tokens, mask = self.encode_prompts(prompts)
        out = self.generate(tokens, mask, num_samples=self.group_size)
        tokens, mask = np.repeat(tokens, self.group_size, axis=0), np.repeat(mask, self.group_size, axis=0)
        hits = np.asarray((out.tokens == self.config.target_token) * out.mask).sum(1)
        rewards = hits / np.maximum(np.asarray(out.mask).sum(1), 1)
        grouped = rewards.reshape(-1, self.group_size)
        adv = (grouped - grouped.mean(1, keepdims=True)).reshape(-1).astype(np.float32)
        example = TrainExample(jnp.asarray(tokens), jnp.asarray(mask), out.tokens, out.mask, jnp.asarray(adv))
        metrics = {"rewards/total/mean": float(rewards.mean())}
        return StepBatch(example, metrics, generated_tokens=int(np.asarray(out.lengths).sum()))

    def loss_function(self) -> LossFn:
        return functools.partial(
            toy_loss,
            temperature=self.rollout.temperature,
            chunk_tokens=self.rollout.logprob_chunk_tokens,
            aggregate=registry.get("loss_aggregation", self.config.loss_agg_mode),
            max_len=self.rollout.max_new_tokens,
            inject_nan=self.config.inject_nan,
        )


def toy_loss(model: nnx.Module, example: TrainExample, *, temperature: float, chunk_tokens: int,
             aggregate: Callable[..., tuple[jax.Array, jax.Array]], max_len: int, inject_nan: bool) -> LossOutput:
    """-A * logp per token, aggregated; the mean log-prob as a metric."""
    logp, _ = completion_logprobs(
        model, example.prompt_tokens, example.prompt_mask, example.completion_tokens,
        temperature=temperature, chunk_tokens=chunk_tokens,
    )
    per_token = -example.advantages[:, None] * logp
    if inject_nan:
        per_token = per_token * jnp.nan
    total, denom = aggregate(per_token, example.completion_mask, max_len=max_len)
    return LossOutput(total, denom, means={"train/logp": (jnp.sum(logp * example.completion_mask), jnp.sum(example.completion_mask))})


def digit_prompts(n: int, *, seed: int = 0) -> list[Prompt]:
    """`n` short prompts of digits, for tests."""
    rng = np.random.default_rng(seed)
    return [Prompt("".join(map(str, rng.integers(0, 10, rng.integers(2, 7))))) for _ in range(n)]


def tree_max_abs_diff(a, b) -> float:
    return max(float(jnp.max(jnp.abs(x - y))) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True))
