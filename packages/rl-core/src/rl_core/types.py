"""The arrays that flow between rollout and the update.

Shapes: B completions, P prompt tokens, T completion tokens.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import jax

from rl_core.packed import Packed


class SharedPrompts(NamedTuple):
    """Each prompt of a batch whose rows come in consecutive groups of G sharing one prompt
    (GRPO's completions of a prompt), once: the update runs it once per group (rl_core.policy.logprobs)."""

    tokens: jax.Array  # [B / G, P] int32, left-padded like the rows'
    mask: jax.Array  # [B / G, P] float32


class TrainExample(NamedTuple):
    """One batch of completions ready for the loss.

    Optional fields are None when the algorithm does not need them; that is
    static per run, so it never causes recompilation.
    """

    prompt_tokens: jax.Array  # [B, P] int32, left-padded
    prompt_mask: jax.Array  # [B, P] float32, 1 = real token
    completion_tokens: jax.Array  # [B, T] int32, padded after EOS
    completion_mask: jax.Array  # [B, T] float32, 1 = token in the loss
    advantages: jax.Array  # [B] float32 (one per completion), or [B, T] (per token: PPO's GAE)
    old_logp: jax.Array | None = None  # [B, T] log-probs of the policy that sampled (num_iterations > 1)
    ref_logp: jax.Array | None = None  # [B, T] reference policy log-probs (beta != 0)
    sampler_logp: jax.Array | None = None  # [B, T] log-probs reported by the sampler (drift metrics, the critic)
    returns: jax.Array | None = None  # [B, T] the critic's targets (a learner with a critic)
    values: jax.Array | None = None  # [B, T] the critic's values at collection time (its clip's anchor)
    packed: Packed | None = None  # the rows packed (training.packing; set by rl_core.train.layout for the update)
    shared_prompts: SharedPrompts | None = None  # each group's prompt once (set by rl_core.train.layout for the update)
    teacher_logp: jax.Array | None = None  # [B, T] a distillation teacher's log-probs (distill_coef != 0)
    # [B, T, layers, k] int32: a mixture of experts' rollout routing, replayed by the policy's passes
    # (algorithm.routing_replay = rollout; rl_core.rollout.sampler.Completions.routing)
    routing: jax.Array | None = None

    @property
    def batch_size(self) -> int:
        return self.completion_tokens.shape[0]


class StepBatch(NamedTuple):
    """What a learner's `produce_examples` returns: the batch plus what to log about it."""

    example: TrainExample
    metrics: Mapping[str, float]
    samples: Sequence[Mapping[str, Any]] = ()
    generated_tokens: int = 0
