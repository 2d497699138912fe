"""Shipped test doubles, the one home of the project's (tests import them from here).

`ToyLearner` exercises everything the base learner owns (rollout, mini- and
micro-batches, the update, checkpoints) with the simplest policy-gradient
loss, -A * logp aggregated by the configured mode. Its reward is the
fraction of completion tokens equal to `ToyConfig.target_token`, computed
from token ids so that it needs no reward package.

`BagPolicy` (with `BAG_PAGING`, its paged-engine adapter) is a policy whose programs compile
several times faster than a transformer's; `make_groups` builds scored groups by hand;
`MismatchedSampler` is the pipeline's learner with a sampler whose log-probs are off by known
factors; `train_counting_compiles` counts what each step after the first compiles.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import PartitionSpec

from rl_core import registry
from rl_core.config import AlgorithmConfig, RolloutConfig, TrainingConfig, check
from rl_core.data import CollectionInputs, Prompt
from rl_core.learner.base import RLLearner, StepBatch
from rl_core.learner.draw import KeyStream
from rl_core.learner.groups import Groups
from rl_core.learner.pipeline import PolicyGradientLearner
from rl_core.learner.state import POLICY, LearnerState
from rl_core.policy.logprobs import completion_logprobs
from rl_core.runtime import compiles
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
    def _collect(self, prompts: Sequence[Prompt], supply: CollectionInputs) -> tuple[StepBatch, CollectionInputs]:
        """Samples, rewards and advantages at once: the batch is the step's examples."""
        keys = KeyStream(supply.rng)
        tokens, mask = self.generator.encode(prompts)
        out = self._generate(tokens, mask, num_samples=self._config.group_size, keys=keys)
        tokens, mask = np.repeat(tokens, self._config.group_size, axis=0), np.repeat(mask, self._config.group_size, axis=0)
        hits = np.asarray((out.tokens == self._config.target_token) * out.mask).sum(1)
        rewards = hits / np.maximum(np.asarray(out.mask).sum(1), 1)
        grouped = rewards.reshape(-1, self._config.group_size)
        adv = (grouped - grouped.mean(1, keepdims=True)).reshape(-1).astype(np.float32)
        example = TrainExample(jnp.asarray(tokens), jnp.asarray(mask), out.tokens, out.mask, jnp.asarray(adv))
        metrics = {"rewards/total/mean": float(rewards.mean())}
        return StepBatch(example, metrics, generated_tokens=int(np.asarray(out.lengths).sum())), supply._replace(
            rng=keys.key)

    def _examples_from(self, batch: StepBatch) -> StepBatch:
        return batch

    def _loss_function(self) -> LossFn:
        return functools.partial(
            toy_loss,
            temperature=self.rollout.temperature,
            chunk_tokens=self.rollout.logprob_chunk_tokens,
            aggregate=registry.get("loss_aggregation", self._config.loss_agg_mode),
            max_len=self.rollout.max_new_tokens,
            inject_nan=self._config.inject_nan,
        )


def stage(learner: RLLearner, state: LearnerState | None = None, *, params: Any = None, **fields: Any) -> None:
    """Put `learner` in the scenario a test needs: `state` (default its current one) with `fields`
    of LearnerState and the policy's `params` replaced. Only tests do this: a run's state changes
    by its steps and `resume` alone, so the learner has no public way to write it."""
    state = (state or learner.state)._replace(**fields)
    if params is not None:
        state = state.with_model(POLICY, state.models[POLICY]._replace(params=params))
    learner._state = state


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


class BagPolicy(nnx.Module):
    """A toy policy satisfying `rl_core.policy.protocols.Policy`: the hidden state of a
    query is the mean of the token embeddings it may attend to.

    It honours the attention mask and the KV-cache protocol (the cache holds
    embeddings [B, S, D]), and the paged engine runs it through `BAG_PAGING`, so
    the samplers and log-prob code run unchanged,
    while its programs compile several times faster than a transformer's.
    """

    def __init__(self, vocab_size: int, dim: int = 8, *, rngs: nnx.Rngs) -> None:
        self.embed = nnx.Embed(vocab_size, dim, rngs=rngs)
        self.out = nnx.Linear(dim, vocab_size, rngs=rngs)
        self._vocab_size = vocab_size
        self._dim = dim

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    def init_cache(self, batch_size: int, max_len: int) -> jax.Array:
        return jnp.zeros((batch_size, max_len, self._dim), jnp.float32)

    def cache_axes(self) -> PartitionSpec:
        return PartitionSpec("batch", "cache_slots", None)

    def __call__(self, tokens, positions, attention_mask, cache=None, cache_index=0, *, outputs_from=0):
        x = self.embed(tokens)
        if cache is None:
            keys = x
        else:
            cache = jax.lax.dynamic_update_slice_in_dim(cache, x, cache_index, axis=1)
            keys = cache
        w = attention_mask.astype(jnp.float32)
        hidden = (w @ keys) / jnp.maximum(jnp.sum(w, axis=-1, keepdims=True), 1.0)
        return hidden[:, outputs_from:], cache

    def logits(self, hidden: jax.Array) -> jax.Array:
        return self.out(hidden).astype(jnp.float32)


class BagPaging:
    """`rl_core.policy.protocols.PagedModel` for `BagPolicy`: the same mean, by the paged engine's attention
    with all-zero queries (a uniform softmax over each token's slots 0..position, values the
    embeddings)."""

    def cache_spec(self, model: BagPolicy) -> tuple[int, int, int, jnp.dtype]:
        return 1, 1, model._dim, jnp.dtype(jnp.float32)

    def forward(self, model: BagPolicy, tokens, positions, pages, page_rows, kv):
        x = model.embed(tokens)[:, None, :]  # [N, 1 kv head, D]
        out, pages = kv(jnp.zeros_like(x), x, x, pages, 0, page_rows, positions)
        return out[:, 0], pages

    def inference_copy(self, model: BagPolicy) -> BagPolicy:
        return model  # float32, no adapters: already what decoding needs


BAG_PAGING = BagPaging()


def make_groups(
    prompts: Sequence[Prompt],
    rewards: Sequence[float],
    *,
    group_size: int,
    completion_tokens: np.ndarray,
    lengths: Sequence[int],
    texts: Sequence[str] | None = None,
    prompt_width: int = 3,
) -> Groups:
    """Groups by hand: prompt i is row block i; prompts are `prompt_width` tokens of id 3 + i.

    A completion of length n has mask 1 on its first n tokens.
    """
    n, t = completion_tokens.shape
    assert n == len(prompts) * group_size == len(rewards) == len(lengths)
    lengths = np.asarray(lengths, np.int32)
    mask = (np.arange(t)[None, :] < lengths[:, None]).astype(np.float32)
    prompt_ids = np.repeat(3 + np.arange(len(prompts)), group_size)
    return Groups(
        group_size=group_size,
        prompts=tuple(prompts),
        prompt_tokens=np.repeat(prompt_ids[:, None], prompt_width, axis=1).astype(np.int32),
        prompt_mask=np.ones((n, prompt_width), np.float32),
        completion_tokens=np.asarray(completion_tokens, np.int32),
        completion_mask=mask,
        sampler_logp=np.full((n, t), -1.0, np.float32) * mask,
        lengths=lengths,
        truncated=lengths >= t,
        texts=tuple(texts) if texts is not None else tuple("x" * int(k) for k in lengths),
        rewards=np.asarray(rewards, np.float32),
    )


class MismatchedSampler(PolicyGradientLearner):
    """A learner whose sampler reports every token's log-prob off by a known factor (as a
    bfloat16 engine would, but known): log pi_sampler = log pi_sampled - log FACTOR, with the
    factors cycling through 0.5, 1.5, 3 (C = 2 caps the last). Fixed advantages +-1 replace
    the random policy's all-tied groups, so the loss is not 0. Keeps the last example and, as
    `last_old_logp`, the trainer's log-probs of it under the weights that sampled it (its
    old_logp, or on an on-policy step, where the loss uses stop_gradient(logp) instead, a pass
    the test double makes before the update)."""

    def _rollout_groups(self, prompts, draw=None, **kwargs):
        groups = super()._rollout_groups(prompts, draw, **kwargs)
        factors = np.resize(np.asarray([0.5, 1.5, 3.0], np.float32), groups.sampler_logp.size)
        off = np.log(factors).reshape(groups.sampler_logp.shape)
        return dataclasses.replace(groups, sampler_logp=groups.sampler_logp - off)

    def _compute_advantages(self, groups):
        return np.resize(np.asarray([1.0, -1.0], np.float32), len(groups.rewards))

    @classmethod
    def on_doubling(cls, config: Any, *, tokenizer: Any, reward_manager: Any) -> MismatchedSampler:
        """One with `config` (a PolicyGradientConfig, e.g. GRPO's) on the tests' toy problem: a
        BagPolicy over the tokenizer's vocabulary (the character tokenizer's), doubling prompts
        '1+1=' .. '4+4=', 2 prompts a step, 3 new tokens, scored by `reward_manager` (a numeric answer's)."""
        return cls(
            config, policy=BagPolicy(tokenizer.vocab_size, rngs=nnx.Rngs(0)), tokenizer=tokenizer,
            train_data=[Prompt(f"{a}+{a}=", {"answer": str(2 * a)}) for a in range(1, 5)],
            training=TrainingConfig(prompts_per_step=2), rollout=RolloutConfig(max_new_tokens=3, max_prompt_tokens=8),
            reward_manager=reward_manager,
        )  # fmt: skip

    def _add_logprobs(self, example):
        self.last_example = example = super()._add_logprobs(example)
        self.last_old_logp = np.asarray(example.old_logp) if example.old_logp is not None else self._behaviour_logprobs(
            example.prompt_tokens, example.prompt_mask, example.completion_tokens)
        return example


def train_counting_compiles(learner, steps: int = 3) -> tuple[list[dict], list[int]]:
    """`steps` train steps: their metrics, and the programs each step after the first compiled."""
    history, new = [learner.train_step()], []
    for _ in range(steps - 1):
        start = compiles.compile_count()
        history.append(learner.train_step())
        new.append(compiles.compile_count() - start)
    return history, new
